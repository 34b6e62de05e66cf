"""Kafka: partitions × worker processes, in the same run. Debates per second, latency and worker
CPU per request through debatebus workers of one consumer group on a private Tansu broker (the
``benchmarks/bus.py`` driver: a closed loop of ``--inflight`` requests, publish → result seen).

    python benchmarks/scale_kafka.py [--requests 600] [--inflight 64] [--latency 0.02 0]

For each model-call latency (``--latency``, seconds per call; 0 is the instant debate, which
makes the workers CPU-bound), four layouts: 1 partition × 1 worker, 1 × 3, 3 × 1 and 3 × 3.
A partition is read by one member of the group at a time, so workers beyond the partition count
idle. Each worker runs ``--concurrency`` debates at once. The debate is bus.py's (3 participants,
judge, moderator, 3 rounds: 14 model calls). Prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bus import Driver, Figures, cpu_seconds, envelope, start_worker, stop_worker  # noqa: E402
from tests.support.servers import TansuServer  # noqa: E402

LAYOUTS = [(1, 1), (1, 3), (3, 1), (3, 3)]  # (partitions, workers)
WORKER = ["-m", "debatebus", "worker", "benchmarks.scale_kafka:worker_app"]


class SlowLLM:
    """bus.py's instant model, answering after ``latency`` seconds."""

    model = "slow"

    def __init__(self, latency: float) -> None:
        from benchmarks.bus_apps import InstantLLM

        self.latency, self.instant = latency, InstantLLM()

    async def complete(self, request: Any) -> Any:
        if self.latency:
            await asyncio.sleep(self.latency)
        return await self.instant.complete(request)


def worker_app() -> Any:
    """``debatebus worker benchmarks.scale_kafka:worker_app``; env SCALE_BROKER, SCALE_TOPIC,
    SCALE_GROUP, SCALE_LATENCY, SCALE_CONCURRENCY. bus.py's debate, store-less (a Kafka bus
    derives no store), with every model call taking SCALE_LATENCY seconds."""
    from debatebus import Debate, Judge, Participant
    from debatebus._worker import DebateBus

    debate = Debate(
        "bench-debate",
        [Participant(n, f"You are {n}.") for n in ("optimist", "critic", "pragmatist")],
        llm=SlowLLM(float(os.environ["SCALE_LATENCY"])), moderator=Participant(
            "moderator", "Moderate."), judge=Judge(), max_rounds=3)
    bus = DebateBus(os.environ["SCALE_BROKER"], group=os.environ["SCALE_GROUP"],
                    concurrency=int(os.environ["SCALE_CONCURRENCY"]),
                    transport_options={"fetch_max_wait_ms": 5})
    bus.subscribe(os.environ["SCALE_TOPIC"], debate.as_handler(durable=False))
    return bus


async def layout_run(bootstrap: str, partitions: int, workers: int, latency: float,
                     args: argparse.Namespace) -> Figures:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    base = f"scale{uuid.uuid4().hex[:6]}:request"
    req_topic, res_topic = base.replace(":", "."), f"event:{base}:completed".replace(":", ".")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(req_topic, partitions, 1),
                               NewTopic(res_topic, partitions, 1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=1)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                fetch_max_wait_ms=5)
    await producer.start()
    await consumer.start()
    tps = [TopicPartition(res_topic, p) for p in range(partitions)]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)

    async def send(rid: str) -> None:
        await producer.send(req_topic, envelope(rid), key=rid.encode())

    driver = Driver(send, args.inflight)

    async def read() -> None:
        while True:
            for records in (await consumer.getmany(timeout_ms=200, max_records=1000)).values():
                for record in records:
                    driver.seen(record.value)

    env = {"SCALE_BROKER": f"kafka://{bootstrap}", "SCALE_TOPIC": base,
           "SCALE_GROUP": f"g-{uuid.uuid4().hex[:8]}", "SCALE_LATENCY": str(latency),
           "SCALE_CONCURRENCY": str(args.concurrency)}
    procs = [start_worker(WORKER, env) for _ in range(workers)]
    reader = asyncio.create_task(read())
    try:
        # Every member joins (a rebalance each) before anything is timed.
        await asyncio.sleep(args.settle)
        await driver.run(max(100, args.requests // 4), f"warm-{uuid.uuid4().hex[:6]}")
        cpu0 = [cpu_seconds(p.pid) for p in procs]
        elapsed, lat = await driver.run(args.requests, f"m-{uuid.uuid4().hex[:6]}")
        cpu = sum(cpu_seconds(p.pid) - c for p, c in zip(procs, cpu0, strict=True))
    finally:
        reader.cancel()
        for proc in procs:
            stop_worker(proc)
        await producer.stop()
        await consumer.stop()
    lat_ms = sorted(x * 1000 for x in lat)
    name = f"{partitions} partition{'s' * (partitions > 1)} × {workers} worker{'s' * (workers > 1)}"
    return Figures(name, args.requests / elapsed, statistics.median(lat_ms),
                   lat_ms[int(len(lat_ms) * 0.99) - 1], 1e6 * cpu / args.requests)


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16, help="debates per worker")
    parser.add_argument("--latency", type=float, nargs="+", default=[0.02, 0.0],
                        help="seconds per model call (0: instant)")
    parser.add_argument("--settle", type=float, default=4.0,
                        help="seconds for the workers to join before the warm-up")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    tansu = TansuServer.start()
    print(f"Kafka (Tansu): {args.requests} requests per run, {args.inflight} in flight, "
          f"{args.concurrency} debates per worker, CPUs: {os.cpu_count()}, load average: "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    try:
        for latency in args.latency:
            print(f"model call latency {latency * 1000:g} ms (14 calls per debate); "
                  "CPU is all workers' together:", flush=True)
            runs: dict[str, list[Figures]] = {}
            for _ in range(args.repeat):
                for partitions, workers in LAYOUTS:
                    figures = await layout_run(tansu.bootstrap, partitions, workers, latency, args)
                    runs.setdefault(figures.name, []).append(figures)
            for measured in runs.values():
                ranked = sorted(measured, key=lambda f: f.per_s)
                mid = ranked[len(ranked) // 2]
                print(f"  {mid.name:<24} {mid.per_s:>7.0f} debates/s ({ranked[0].per_s:.0f}–"
                      f"{ranked[-1].per_s:.0f})   p50 {mid.p50_ms:7.1f} ms   p99 {mid.p99_ms:7.1f} ms"
                      f"   worker CPU/request {mid.worker_cpu_us:4.0f} µs", flush=True)
    finally:
        tansu.stop()


def kafka_section(args: argparse.Namespace) -> None:
    """``benchmarks/scale.py --section kafka``: this module with its defaults."""
    asyncio.run(main([]))


if __name__ == "__main__":
    asyncio.run(main())
