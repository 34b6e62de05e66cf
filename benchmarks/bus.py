"""Debates per second and request→result latency through each real transport, side by side with
the raw round trip of the same client library and a plain FastStream handler, in one run.

    python benchmarks/bus.py [--requests 4000] [--inflight 64] [--no-kafka]

Each scenario starts one worker process and drives it from this process with a closed loop of
``--inflight`` outstanding requests; latency is publish → result seen by the driver.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.servers import RedisServer, TansuServer  # noqa: E402

RID = re.compile(rb'"requestId": ?"([^"]+)"')


@dataclass
class Figures:
    name: str
    per_s: float
    p50_ms: float
    p99_ms: float
    #: CPU time per request (µs) of the worker process and of the broker (redis-server, Tansu).
    worker_cpu_us: float = 0.0
    broker_cpu_us: float = 0.0

    def row(self) -> str:
        cpu = (f"   CPU/request: worker {self.worker_cpu_us:4.0f} µs, "
               f"broker {self.broker_cpu_us:4.0f} µs")
        return (f"{self.name:<34} {self.per_s:>9.0f}/s   p50 {self.p50_ms:7.2f} ms   "
                f"p99 {self.p99_ms:7.2f} ms{cpu}")


def envelope(rid: str) -> bytes:
    return (b'{"requestId":"' + rid.encode() + b'","payload":{"input":"Should we adopt '
            b'microservices?"}}')


class Driver:
    """Closed-loop load: keep ``inflight`` requests outstanding, time each to its result."""

    def __init__(self, send: Callable[[str], Awaitable[None]], inflight: int) -> None:
        self.send = send
        self.slots = asyncio.Semaphore(inflight)
        self.started: dict[str, float] = {}
        self.latencies: list[float] = []
        self.done = asyncio.Event()
        self.expected = 0

    def seen(self, body: bytes) -> None:
        match = RID.search(body)
        if match is None:
            return
        t0 = self.started.pop(match.group(1).decode(), None)
        if t0 is None:
            return
        self.latencies.append(time.perf_counter() - t0)
        self.slots.release()
        if len(self.latencies) >= self.expected:
            self.done.set()

    async def run(self, n: int, tag: str) -> tuple[float, list[float]]:
        self.latencies, self.expected = [], n
        self.done.clear()
        t0 = time.perf_counter()
        for i in range(n):
            await self.slots.acquire()
            rid = f"{tag}-{i}"
            self.started[rid] = time.perf_counter()
            await self.send(rid)
        await asyncio.wait_for(self.done.wait(), 300)
        return time.perf_counter() - t0, self.latencies


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: Broker processes by kind ("redis", "kafka"), for CPU figures.
BROKER_PIDS: dict[str, int] = {}


async def measure(name: str, driver: Driver, requests: int, worker_pid: int,
                  broker_pid: int) -> Figures:
    await driver.run(min(300, requests), f"warm-{uuid.uuid4().hex[:6]}")
    pids = [worker_pid, broker_pid]
    cpu0 = [cpu_seconds(pid) for pid in pids]
    elapsed, lat = await driver.run(requests, f"m-{uuid.uuid4().hex[:6]}")
    worker_cpu, broker_cpu = (1e6 * (cpu_seconds(pid) - c0) / requests
                              for pid, c0 in zip(pids, cpu0, strict=True))
    lat_ms = sorted(x * 1000 for x in lat)
    return Figures(name, requests / elapsed, statistics.median(lat_ms),
                   lat_ms[int(len(lat_ms) * 0.99) - 1], worker_cpu, broker_cpu)


DEBATEBUS = ["-m", "debatebus", "worker", "benchmarks.bus_apps:debatebus_app"]
#: The two debatebus Redis Streams scenarios the targets compare: the default handler (durable,
#: checkpoints in the broker's Redis) and the same handler with ``durable=False``.
DEFAULT = "debatebus Redis Streams (default: durable)"
PLAIN = "debatebus Redis Streams durable=False"
#: The same two with a model whose every call waits (for nothing), as a real one does: a durable
#: debate's commits are written while it waits (group commit), so only these pay for them all.
DEFAULT_WAITS = "debatebus default (model waits)"
PLAIN_WAITS = "debatebus durable=False (model waits)"
RAW_KAFKA = "raw aiokafka produce+consume"
KAFKA = "debatebus Kafka"
LOG = Path(os.environ.get("BENCH_LOG", "/tmp/debatebus-bench-workers.log"))


def start_worker(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # Workers log to a file: a pipe nobody reads fills up and blocks a chatty worker.
    return subprocess.Popen([sys.executable, *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                            stdout=LOG.open("ab"), stderr=subprocess.STDOUT)


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def scenario(name: str, driver: Driver, requests: int, worker: list[str],
                   env: dict[str, str], read: Callable[[], Awaitable[None]],
                   *cleanups: Callable[[], Awaitable[Any]], broker: str = "redis",
                   settle_s: float = 0.0) -> Figures:
    """Start the worker and the driver's result reader, measure, then tear everything down."""
    proc = start_worker(worker, env)
    reader_task = asyncio.create_task(read())
    try:
        await asyncio.sleep(settle_s)
        return await measure(name, driver, requests, proc.pid, BROKER_PIDS[broker])
    except TimeoutError:
        # Say whose fault a stall is: the driver's result reader dying, or the worker.
        died = reader_task.done() and not reader_task.cancelled() and reader_task.exception()
        print(f"  {name}: {len(driver.latencies)} of {driver.expected} results seen when the "
              f"driver gave up; result reader: {'died: ' + repr(died) if died else 'alive'}",
              flush=True)
        raise
    finally:
        reader_task.cancel()
        stop_worker(proc)
        for cleanup in cleanups:
            await cleanup()


# ---- Redis Streams / pub/sub drivers ---------------------------------------------------------


async def redis_streams_run(name: str, url: str, worker: list[str], env: dict[str, str],
                            requests: int, inflight: int, field: bytes = b"envelope",
                            encode: Callable[[bytes, str], Awaitable[bytes]] | None = None) -> Figures:
    import redis.asyncio as redis

    stream = f"bench{uuid.uuid4().hex[:6]}:request"
    results = f"event:{stream}:completed"
    client = redis.Redis.from_url(url)
    # The results stream is new to this scenario: read it from its start. ("$" would skip what
    # is added between a blocking read that timed out and the next one: the driver then waited
    # forever for results the worker had published.)
    last = b"0-0"

    async def send(rid: str) -> None:
        body = envelope(rid)
        await client.xadd(stream, {field: await encode(body, rid) if encode else body})

    driver = Driver(send, inflight)

    async def read() -> None:
        nonlocal last
        reader = redis.Redis.from_url(url)
        while True:
            reply = await reader.xread({results: last}, count=512, block=1000)
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id
                    for value in fields.values():
                        driver.seen(value)

    if encode is not None:  # FastStream makes its group at "$": requests sent first would be lost
        await client.xgroup_create(stream, "fs", id="0", mkstream=True)
    return await scenario(name, driver, requests, worker, {**env, "BENCH_REQUESTS": stream}, read,
                          client.aclose)


async def redis_pubsub_run(name: str, url: str, requests: int, inflight: int) -> Figures:
    import redis.asyncio as redis

    channel = f"bench{uuid.uuid4().hex[:6]}:request"
    client = redis.Redis.from_url(url)
    pubsub = client.pubsub()
    await pubsub.subscribe(f"event:{channel}:completed")
    driver = Driver(lambda rid: client.publish(channel, envelope(rid)), inflight)

    async def read() -> None:
        async for message in pubsub.listen():
            if message["type"] == "message":
                driver.seen(message["data"])

    env = {"BENCH_BROKER": url.replace("redis://", "redis+pubsub://"), "BENCH_REQUESTS": channel}
    # At-most-once: requests sent before the worker subscribes are lost, so give it time.
    return await scenario(name, driver, requests, DEBATEBUS, env, read, client.aclose,
                          settle_s=2.0)


async def faststream_encode(body: bytes, rid: str) -> bytes:
    from faststream.redis.parser.binary import BinaryMessageFormatV1

    return await BinaryMessageFormatV1.encode(message=body, reply_to=None,
                                              headers={"content-type": "application/json"},
                                              correlation_id=rid)


# ---- Kafka -------------------------------------------------------------------------------------


async def kafka_run(name: str, bootstrap: str, worker: list[str], env: dict[str, str],
                    requests: int, inflight: int) -> Figures:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    base = f"bench{uuid.uuid4().hex[:6]}:request"
    req_topic, res_topic = base.replace(":", "."), f"event:{base}:completed".replace(":", ".")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(req_topic, 1, 1), NewTopic(res_topic, 1, 1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=1)
    await producer.start()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                fetch_max_wait_ms=5)
    await consumer.start()
    tp = TopicPartition(res_topic, 0)
    consumer.assign([tp])
    await consumer.seek_to_end(tp)

    async def send(rid: str) -> None:
        await producer.send(req_topic, envelope(rid), key=rid.encode())

    driver = Driver(send, inflight)

    async def read() -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=200, max_records=1000)
            for records in batches.values():
                for record in records:
                    driver.seen(record.value)

    return await scenario(name, driver, requests, worker, {**env, "BENCH_REQUESTS": base}, read,
                          producer.stop, consumer.stop, broker="kafka")


# ---- checkpoint size ---------------------------------------------------------------------------


async def checkpoint_bytes_per_round(url: str) -> list[int]:
    from benchmarks.bus_apps import instant_debate

    from debatebus.checkpoints import store_from_url
    from debatebus.handlers._checkpointing import counters_of, encode_entry

    store = store_from_url(url, prefix=f"size{uuid.uuid4().hex[:4]}")
    sizes: list[int] = []

    async def commit(progress: Any, item: Any) -> None:
        await store.append("d", encode_entry(item), counters_of(progress))
        sizes.append(await store.size_bytes("d"))

    async with store:
        await store.begin("d", b"{}")
        sizes.append(await store.size_bytes("d"))
        await instant_debate().run("Should we adopt microservices?", on_commit=commit)
    return [b - a for a, b in itertools.pairwise(sizes)]


# ---- main --------------------------------------------------------------------------------------

async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--no-kafka", action="store_true")
    parser.add_argument("--only", help="comma-separated scenario names")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds over all scenarios; each figure is the median run (this "
                        "machine is noisy, and alternating scenarios spreads the noise evenly)")
    args = parser.parse_args()
    n, k = args.requests, args.inflight
    redis_server = RedisServer.start()
    assert redis_server.proc is not None
    BROKER_PIDS["redis"] = redis_server.proc.pid
    url = redis_server.url
    rows: list[Figures] = []
    scenarios: list[tuple[str, Callable[[], Awaitable[Figures]]]] = [
        ("raw redis-py XADD+XREADGROUP+XACK", lambda: redis_streams_run(
            "raw redis-py XADD+XREADGROUP+XACK", url,
            ["benchmarks/bus_apps.py", "raw-redis", url], {}, n, k)),
        ("FastStream Redis Streams", lambda: redis_streams_run(
            "FastStream Redis Streams", url, ["benchmarks/bus_apps.py", "faststream", url, "1"],
            {}, n, k, field=b"__data__", encode=faststream_encode)),
        ("FastStream Redis Streams (16 workers)", lambda: redis_streams_run(
            "FastStream Redis Streams (16 workers)", url,
            ["benchmarks/bus_apps.py", "faststream", url, "16"], {}, n, k, field=b"__data__",
            encode=faststream_encode)),
        ("FastStream Redis Streams (64 workers)", lambda: redis_streams_run(
            "FastStream Redis Streams (64 workers)", url,
            ["benchmarks/bus_apps.py", "faststream", url, "64"], {}, n, k, field=b"__data__",
            encode=faststream_encode)),
        (PLAIN, lambda: redis_streams_run(
            PLAIN, url, DEBATEBUS, {"BENCH_BROKER": url, "BENCH_DURABLE": "0"}, n, k)),
        (DEFAULT, lambda: redis_streams_run(
            DEFAULT, url, DEBATEBUS, {"BENCH_BROKER": url}, n, k)),
        (PLAIN_WAITS, lambda: redis_streams_run(
            PLAIN_WAITS, url, DEBATEBUS,
            {"BENCH_BROKER": url, "BENCH_DURABLE": "0", "BENCH_LLM_WAITS": "1"}, n, k)),
        (DEFAULT_WAITS, lambda: redis_streams_run(
            DEFAULT_WAITS, url, DEBATEBUS, {"BENCH_BROKER": url, "BENCH_LLM_WAITS": "1"}, n, k)),
        ("debatebus Redis Streams + memory checkpoints", lambda: redis_streams_run(
            "debatebus Redis Streams + memory checkpoints", url, DEBATEBUS,
            {"BENCH_BROKER": url, "BENCH_STORE": "memory://"}, n, k)),
        ("debatebus Redis pub/sub", lambda: redis_pubsub_run("debatebus Redis pub/sub", url, n, k)),
    ]
    tansu = None
    if not args.no_kafka:
        tansu = TansuServer.start()
        assert tansu.proc is not None
        BROKER_PIDS["kafka"] = tansu.proc.pid
        boot = tansu.bootstrap
        scenarios += [
            (RAW_KAFKA, lambda: kafka_run(
                RAW_KAFKA, boot, ["benchmarks/bus_apps.py", "raw-kafka", boot], {},
                max(n // 4, 500), k)),
            (KAFKA, lambda: kafka_run(
                KAFKA, boot, DEBATEBUS, {"BENCH_BROKER": f"kafka://{boot}"}, max(n // 4, 500), k)),
        ]
    only = set(args.only.split(",")) if args.only else None
    print(f"requests per scenario: {n} (Kafka: {max(n // 4, 500)}), in flight: {k}, "
          f"CPUs: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}", flush=True)
    runs: dict[str, list[Figures]] = {}
    try:
        for attempt in range(args.repeat):
            for name, run in scenarios:
                if only and name not in only:
                    continue
                figures = await run()
                runs.setdefault(name, []).append(figures)
                print(f"  run {attempt + 1}: {figures.row()}", flush=True)
        per_round = await checkpoint_bytes_per_round(url)
    finally:
        redis_server.stop()
        if tansu is not None:
            tansu.stop()
    print(f"\nmedian of {args.repeat} runs:")
    for figures in runs.values():
        rows.append(sorted(figures, key=lambda f: f.per_s)[len(figures) // 2])
        print(rows[-1].row())
    by = {r.name: r for r in rows}
    if args.inflight > 1:  # the targets are about throughput; one in flight measures latency
        _ratios(by)
        _paired_cost(runs)
        _kafka_share(runs)
    print(f"checkpoint bytes per commit (framing, then rounds 1..3; Redis MEMORY USAGE): "
          f"{per_round}")


def _ratios(by: dict[str, Figures]) -> None:
    default, plain = by.get(DEFAULT), by.get(PLAIN)
    fs, raw = by.get("FastStream Redis Streams"), by.get("raw redis-py XADD+XREADGROUP+XACK")
    if default and fs:
        print(f"debatebus (default, durable) / FastStream throughput: "
              f"{default.per_s / fs.per_s:.2f}× (target ≥ 2×)")
    if plain and raw:
        print(f"debatebus durable=False per-debate time / raw round trip: "
              f"{raw.per_s / plain.per_s:.2f}×")
    if default and plain:
        print(f"durability cost: {100 * (1 - default.per_s / plain.per_s):.0f}% of throughput "
              "against durable=False (target ≤ 35%)")
    waits, plain_waits = by.get(DEFAULT_WAITS), by.get(PLAIN_WAITS)
    if waits and plain_waits:
        print(f"durability cost when every commit is written (model waits): "
              f"{100 * (1 - waits.per_s / plain_waits.per_s):.0f}%")


def _paired_cost(runs: dict[str, list[Figures]]) -> None:
    """Durability cost from back-to-back pairs: a slow spell hits both runs of a pair alike."""
    costs = sorted(1 - d.per_s / p.per_s
                   for p, d in zip(runs.get(PLAIN, []), runs.get(DEFAULT, []), strict=False))
    if costs:
        print(f"durability cost per back-to-back pair: median {100 * costs[len(costs) // 2]:.0f}% "
              f"(pairs: {', '.join(f'{100 * c:.0f}%' for c in costs)})")


def _kafka_share(runs: dict[str, list[Figures]]) -> None:
    """debatebus Kafka's throughput as a share of the raw aiokafka echo's, per back-to-back pair,
    and how busy the worker was (its CPU per request × requests per second)."""
    pairs = list(zip(runs.get(RAW_KAFKA, []), runs.get(KAFKA, []), strict=False))
    if not pairs:
        return
    shares = sorted(k.per_s / raw.per_s for raw, k in pairs)
    busy = sorted(k.worker_cpu_us * k.per_s / 1e6 for _, k in pairs)
    print(f"debatebus Kafka / raw aiokafka echo throughput per pair: median "
          f"{100 * shares[len(shares) // 2]:.1f}% (target ≥ 40%; pairs: "
          f"{', '.join(f'{100 * x:.1f}%' for x in shares)}); worker busy "
          f"{', '.join(f'{100 * b:.0f}%' for b in busy)} of the time")


if __name__ == "__main__":
    asyncio.run(main())
