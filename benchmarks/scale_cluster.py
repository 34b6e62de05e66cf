"""Redis Cluster against single-node Redis, in the same run: instant debates per second, latency
and CPU per request through one debatebus worker (the ``benchmarks/bus.py`` driver: a closed loop
of ``--inflight`` requests, publish → result seen), on a private redis-server and on a private
3-master cluster (tests/support/cluster.py), alternating so the machine's noise spreads evenly.

    python benchmarks/scale_cluster.py [--requests 3000] [--inflight 64] [--repeat 3]

One event type is one hash-tag family, so all its traffic is on one master of the cluster (the
broker CPU column is that master's); a cluster spreads *several* event types (and the debates'
checkpoint keys, tagged per debate id, which land on every master). Prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bus import (  # noqa: E402
    BROKER_PIDS,
    DEBATEBUS,
    Driver,
    Figures,
    envelope,
    scenario,
)
from tests.support.cluster import RedisClusterServers  # noqa: E402
from tests.support.servers import RedisServer  # noqa: E402

from debatebus._redis import cluster_key  # noqa: E402


async def streams_run(name: str, url: str, broker_pid: Callable[[str], int], env: dict[str, str],
                      requests: int, inflight: int) -> Figures:
    """``benchmarks.bus.redis_streams_run``'s driver, writing and reading the streams where the
    worker keeps them: the topic itself on one node, its cluster key on a cluster."""
    import redis.asyncio as redis

    cluster = "cluster=true" in url
    event_type = f"bench{uuid.uuid4().hex[:6]}:request"
    key = cluster_key if cluster else (lambda topic: topic)
    stream, results = key(event_type), key(f"event:{event_type}:completed")
    plain = url.replace("?cluster=true", "")

    def client() -> Any:
        return redis.RedisCluster.from_url(plain) if cluster else redis.Redis.from_url(plain)

    writer = client()

    async def send(rid: str) -> None:
        await writer.xadd(stream, {b"envelope": envelope(rid)})

    driver = Driver(send, inflight)

    async def read() -> None:
        reader, last = client(), b"0-0"
        while True:
            reply = await reader.xread({results: last}, count=512, block=1000)
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id
                    driver.seen(fields[b"envelope"])

    BROKER_PIDS[name] = broker_pid(stream)
    return await scenario(name, driver, requests, DEBATEBUS,
                          {**env, "BENCH_BROKER": url, "BENCH_REQUESTS": event_type}, read,
                          writer.aclose, broker=name, settle_s=0.5)


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    single, cluster = RedisServer.start(appendonly=False), RedisClusterServers.start()
    assert single.proc is not None
    pids = dict(zip(cluster.ports, (p.pid for p in cluster.procs), strict=True))
    single_pid = single.proc.pid
    n, k = args.requests, args.inflight
    scenarios: list[tuple[str, Callable[[], Awaitable[Figures]]]] = []
    for durable in (True, False):
        env = {} if durable else {"BENCH_DURABLE": "0"}
        what = "durable (default)" if durable else "durable=False"
        scenarios += [
            (f"single-node Redis, {what}", lambda env=env, what=what: streams_run(
                f"single-node Redis, {what}", single.url, lambda _: single_pid, env, n, k)),
            (f"3-master Redis Cluster, {what}", lambda env=env, what=what: streams_run(
                f"3-master Redis Cluster, {what}", cluster.url,
                lambda stream: pids[cluster.owner(stream)], env, n, k)),
        ]
    print(f"requests per run: {n}, in flight: {k}, CPUs: {os.cpu_count()}, "
          f"load average: {os.getloadavg()[0]:.2f}", flush=True)
    runs: dict[str, list[Figures]] = {}
    try:
        for attempt in range(args.repeat):
            for name, run in scenarios:
                figures = await run()
                runs.setdefault(name, []).append(figures)
                print(f"  run {attempt + 1}: {figures.row()}", flush=True)
    finally:
        single.stop()
        cluster.stop()
    print(f"\nmedian of {args.repeat} runs (range of debates/s):")
    medians = {}
    for name, figures in runs.items():
        ranked = sorted(figures, key=lambda f: f.per_s)
        medians[name] = ranked[len(ranked) // 2]
        print(f"{medians[name].row()}   [{ranked[0].per_s:.0f}–{ranked[-1].per_s:.0f}/s]")
    for what in ("durable (default)", "durable=False"):
        one, many = medians[f"single-node Redis, {what}"], medians[f"3-master Redis Cluster, {what}"]
        print(f"cluster / single-node, {what}: {many.per_s / one.per_s:.2f}x debates/s, "
              f"worker CPU {many.worker_cpu_us / one.worker_cpu_us:.2f}x per request")


def cluster_section(args: argparse.Namespace) -> None:
    """``benchmarks/scale.py --section cluster``: this module with its defaults."""
    asyncio.run(main([]))


if __name__ == "__main__":
    asyncio.run(main())
