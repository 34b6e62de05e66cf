"""Scaling figures (issue #15), one section per way a fleet grows.

    python benchmarks/scale.py [--section ratelimit] [--seconds 10]

Sections:
- ratelimit: rate limiter accuracy. 3 worker processes share one Redis rate limit through
  ``RateLimitedLLM``; each runs concurrent model calls (a FunctionLLM that sleeps and reports a
  usage below the limiter's estimate). Prints requests and tokens per minute achieved against the
  configured limit. Minutes are shortened (``--period``) so a run takes seconds; figures are per
  configured minute.
- inflight: in-flight capacity. One worker process (``DebateBus`` on a private redis-server,
  ``--concurrency`` high) serves bursts of ``--burst-sizes`` debates of the instant-debate shape
  (3 participants, judge, moderator, ``--rounds`` rounds: 14 model calls at 3) whose every model
  call sleeps ``--call-latency`` s. Once with the default durable handler (checkpoints in the
  broker's Redis), once with memory:// checkpoints. Prints the peak of debates in flight (model
  calls waiting at once, each debate making one at a time), debates/s, the burst's time against
  the ideal (calls per debate × call latency), the worker's RSS idle/peak/after, bytes per
  in-flight debate, worker CPU (and the part of it spent in cyclic garbage collections, with
  the worker's ``Collector``: debatebus's default, ``--gc-thresholds``, or Python's own with
  ``--python-gc``) and Redis commands per debate. Then an in-process tracemalloc
  snapshot of ``--trace-debates`` debates in flight, by file:line, and what is left once they
  are answered.

Prints figures only: no timed assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import linecache
import multiprocessing
import os
import random
import statistics
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bus import cpu_seconds  # noqa: E402
from benchmarks.bus_apps import InstantLLM  # noqa: E402
from benchmarks.scale_cluster import cluster_section  # noqa: E402
from benchmarks.scale_kafka import kafka_section  # noqa: E402
from tests.support.servers import RedisServer  # noqa: E402

from debatebus import Debate, Judge, Participant  # noqa: E402
from debatebus._collector import DEFAULT_COLLECTOR, Collector  # noqa: E402
from debatebus._usage import TokenUsage  # noqa: E402
from debatebus._worker import DebateBus  # noqa: E402
from debatebus.checkpoints import store_from_url  # noqa: E402
from debatebus.llm import FunctionLLM, LLMRequest, LLMResponse, Message  # noqa: E402
from debatebus.llm._ratelimit import RateLimit, RateLimitedLLM  # noqa: E402
from debatebus.llm._ratelimit_redis import RedisRateLimiter  # noqa: E402

# ---- rate limiter accuracy ------------------------------------------------------------------------

PROMPT = LLMRequest("You are terse.", (Message("user", "Should we adopt microservices? " * 13),),
                    max_tokens=100)  # the limiter estimates 100 prompt + 100 answer tokens
Call = tuple[float, int]  # granted at (time.time()), tokens used


async def _worker_calls(url: str, name: str, limit: RateLimit, callers: int, latency_s: float,
                        seconds: float, seed: int) -> tuple[list[Call], list[float]]:
    """One worker process: ``callers`` concurrent callers, each calling until ``seconds`` pass.
    Returns its calls and every wait for budget."""
    rng = random.Random(seed)
    calls: list[Call] = []
    waits: list[float] = []
    end = time.time() + seconds

    async def reply(request: LLMRequest) -> LLMResponse:
        granted = time.time()
        await asyncio.sleep(latency_s)
        used = TokenUsage.of(100, rng.randint(20, 100))  # answers end before max_tokens
        if granted < end:
            calls.append((granted, used.total_tokens))
        return LLMResponse("ok", usage=used)

    limiter = RedisRateLimiter(url, name, limit, on_wait=lambda _, waited: waits.append(waited))
    llm = RateLimitedLLM(FunctionLLM(reply, model=name), limiter)

    async def caller() -> None:
        while time.time() < end:
            await llm.complete(PROMPT)

    await asyncio.gather(*(caller() for _ in range(callers)))
    await limiter.close()
    return calls, waits


def _worker(args: tuple[Any, ...], barrier: Any, out: Any) -> None:
    barrier.wait()
    out.put(asyncio.run(_worker_calls(*args)))


def _run_fleet(args: argparse.Namespace, url: str, limit: RateLimit,
               ) -> tuple[float, list[Call], list[float]]:
    """Runs the worker processes on one limit; returns the start time, calls and waits."""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(args.processes + 1), ctx.Queue()
    name = f"bench-{time.time_ns()}"
    procs = [ctx.Process(target=_worker, args=(
        (url, name, limit, args.callers, args.latency, args.seconds, i), barrier, out))
        for i in range(args.processes)]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=60)
    started = time.time()
    calls: list[Call] = []
    waits: list[float] = []
    for _ in procs:
        worker_calls, worker_waits = out.get(timeout=args.seconds + 60)
        calls += worker_calls
        waits += worker_waits
    for proc in procs:
        proc.join(timeout=30)
    return started, calls, sorted(waits)


def ratelimit_section(args: argparse.Namespace) -> None:
    print(f"rate limiter accuracy: {args.processes} worker processes × {args.callers} callers "
          f"({args.latency:g} s per call), one Redis bucket, a 'minute' of {args.period:g} s, "
          f"burst {args.burst:g}, {args.seconds:g} s per run; figures per configured minute, "
          "after the first second (which spends the initial bucket)")
    # One run where the request limit binds, one where the token limit does (about 160 tokens a
    # call against the limiter's estimate of 200, corrected after each call).
    scenarios = {"requests bind": (args.rpm, args.rpm * 1000),
                 "tokens bind": (args.tpm, args.tpm)}
    redis = RedisServer.start(appendonly=False)
    try:
        for label, (rpm, tpm) in scenarios.items():
            limit = RateLimit(requests_per_minute=rpm, tokens_per_minute=tpm,
                              period_s=args.period, burst=args.burst)
            started, calls, waits = _run_fleet(args, redis.url, limit)
            _print_ratelimit(label, args, limit, started, calls, waits)
    finally:
        redis.stop()


def _print_ratelimit(label: str, args: argparse.Namespace, limit: RateLimit, started: float,
                     calls: list[Call], waits: list[float]) -> None:
    steady = [call for call in calls if call[0] >= started + 1.0]
    per_minute = limit.period_s / (args.seconds - 1.0)
    requests = len(steady) * per_minute
    tokens = sum(tokens for _, tokens in steady) * per_minute
    rpm, tpm = limit.requests_per_minute or 0.0, limit.tokens_per_minute or 0.0
    print(f"  {label:<14} requests/min {requests:8.0f} of {rpm:8.0f} ({requests / rpm:6.1%})   "
          f"tokens/min {tokens:9.0f} of {tpm:9.0f} ({tokens / tpm:6.1%})   "
          f"calls {len(calls)}, wait p50 {statistics.median(waits):.3f} s, "
          f"p99 {waits[int(0.99 * (len(waits) - 1))]:.3f} s")


# ---- in-flight capacity --------------------------------------------------------------------------

QUESTION = "Should we adopt microservices?"
NOW, PEAK, CALLS = range(3)  # counters the worker shares: model calls waiting, their peak, made
#: Then, per generation, the cyclic collections the worker ran and the ns they took.
GC_RUNS, GC_NS = 3, 6


class SleepyLLM:
    """A provider taking ``latency_s`` per call, then answering like the instant debate's
    (``InstantLLM``). Not ``FunctionLLM``: that keeps every request, which would be counted as the
    debates' memory."""

    model = "sleepy"

    def __init__(self, latency_s: float, counts: Any) -> None:
        self.latency_s = latency_s
        self.counts = counts
        self.answers = InstantLLM()
        #: Told the number of calls made so far, at each call.
        self.on_call: Callable[[int], object] = lambda made: None

    async def complete(self, request: LLMRequest) -> LLMResponse:
        counts = self.counts
        counts[NOW] += 1
        counts[CALLS] += 1
        self.on_call(counts[CALLS])
        counts[PEAK] = max(counts[PEAK], counts[NOW])
        try:
            await asyncio.sleep(self.latency_s)
        finally:
            counts[NOW] -= 1
        return await self.answers.complete(request)


def sleepy_bus(url: str, stream: str, args: argparse.Namespace, store: str, llm: SleepyLLM,
               **options: Any) -> DebateBus:
    """A worker serving the instant debate's shape, every call sleeping: ``store`` "default" is
    the durable default (the broker's Redis), else a checkpoint store URL."""
    debate = Debate("bench-debate",
                    [Participant(n, f"You are {n}.") for n in ("optimist", "critic", "pragmatist")],
                    llm=llm,
                    moderator=Participant("moderator", "Moderate."), judge=Judge(),
                    max_rounds=args.rounds)
    durable: dict[str, Any] = {"lease_ttl_s": args.lease_ttl} if args.lease_ttl else {}
    if store != "default":
        durable["store"] = store_from_url(store)
    bus = DebateBus(url, concurrency=args.concurrency, **options)
    bus.subscribe(stream, debate.as_handler(**durable))
    return bus


def _count_collections(counts: Any) -> None:
    """Counts the worker's cyclic collections, and the CPU time they take, by generation."""
    started = [0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.process_time_ns()
        else:
            counts[GC_RUNS + info["generation"]] += 1
            counts[GC_NS + info["generation"]] += time.process_time_ns() - started[0]

    gc.callbacks.append(on_gc)


def collector_of(args: argparse.Namespace) -> Collector:
    """The in-flight worker's cyclic GC settings: debatebus's default, Python's own
    (``--python-gc``), or other thresholds."""
    if args.python_gc:
        return Collector(freeze=False, thresholds=None)
    if args.gc_thresholds is not None:  # (0, 0, 0): no automatic cyclic garbage collection
        return Collector(thresholds=tuple(args.gc_thresholds))
    return DEFAULT_COLLECTOR


def _inflight_worker(url: str, stream: str, args: argparse.Namespace, store: str,
                     counts: Any) -> None:
    _count_collections(counts)

    async def serve() -> None:
        llm = SleepyLLM(args.call_latency, counts)
        async with sleepy_bus(url, stream, args, store, llm,
                              collector=collector_of(args)) as bus:
            await bus.run()  # until SIGTERM

    try:
        import uvloop  # what ``debatebus worker`` runs on when it is installed

        uvloop.run(serve())
    except ImportError:
        asyncio.run(serve())


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    """A process's resident set (or, with ``VmHWM``, its peak so far), in KiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for process {pid}")


async def _publish(client: Any, stream: str, n: int, tag: str) -> None:
    """Sends ``n`` requests; their ids are unique to ``stream`` (a reused id replays from the
    store)."""
    for start in range(0, n, 500):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(n, start + 500)):
            rid = f"{stream}-{tag}-{i}"
            pipe.xadd(stream, {b"envelope": (f'{{"requestId":"{rid}","payload":{{"input":'
                                             f'"{QUESTION}"}}}}').encode()})
        await pipe.execute()


async def _settled(client: Any, stream: str) -> int:
    """How many results (completed or failed) the worker has published on ``stream``."""
    return int(await client.xlen(f"event:{stream}:completed")
               + await client.xlen(f"event:{stream}:failed"))


async def _wait_settled(client: Any, stream: str, n: int, timeout_s: float,
                        on_tick: Callable[[], None] | None = None) -> None:
    """Waits until ``n`` results are out, calling ``on_tick`` every 0.1 s meanwhile."""
    t0 = time.perf_counter()
    while await _settled(client, stream) < n:
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"{await _settled(client, stream)} of {n} results in {timeout_s} s")
        if on_tick is not None:
            on_tick()
        await asyncio.sleep(0.1)


async def _burst(url: str, args: argparse.Namespace, store: str, n: int) -> dict[str, float]:
    """One worker process, one warm-up debate (counting the calls a debate makes), then a burst
    of ``n``."""
    import redis.asyncio as redis

    ctx = multiprocessing.get_context("spawn")
    counts = ctx.RawArray("q", GC_NS + 3)
    stream = f"inflight{uuid.uuid4().hex[:6]}:request"
    proc = ctx.Process(target=_inflight_worker, args=(url, stream, args, store, counts))
    proc.start()
    assert proc.pid is not None
    client = redis.Redis.from_url(url)
    try:
        await _publish(client, stream, 1, "warm")
        await _wait_settled(client, stream, 1, 120 + 20 * args.call_latency)
        calls, idle = counts[CALLS], rss_kb(proc.pid)
        counts[PEAK] = 0
        rss_peak = idle

        def sample() -> None:
            nonlocal rss_peak
            rss_peak = max(rss_peak, rss_kb(proc.pid))

        commands, cpu0, gc0 = await _commands(client), cpu_seconds(proc.pid), counts[GC_RUNS:]
        t0 = time.perf_counter()
        await _publish(client, stream, n, "burst")
        published = time.perf_counter() - t0
        await _wait_settled(client, stream, n + 1, 60 + 20 * calls * args.call_latency + n / 50,
                            sample)
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(proc.pid) - cpu0
        gcs = [after - before for after, before in zip(counts[GC_RUNS:], gc0, strict=True)]
        failed = await client.xlen(f"event:{stream}:failed")
        commands = {name: (count - commands.get(name, 0)) / n
                    for name, count in (await _commands(client)).items()}
        await asyncio.sleep(1.0)
        return {"calls": calls, "ideal": calls * args.call_latency,
                "elapsed": elapsed, "published": published, "inflight": counts[PEAK],
                "idle": idle, "peak": max(rss_peak, rss_kb(proc.pid, "VmHWM")),
                "after": rss_kb(proc.pid), "failed": failed, "cpu_ms": 1000 * cpu / n,
                "full_gcs": gcs[2], "gc_s": sum(gcs[3:]) / 1e9,
                **{f"redis {name}": count for name, count in commands.items() if count >= 0.05}}
    finally:
        proc.terminate()
        proc.join(60)
        await client.delete(stream, f"event:{stream}:completed", f"event:{stream}:failed")
        await client.aclose()


async def _commands(client: Any) -> dict[str, int]:
    """Commands redis-server ran so far, by name, but the driver's (XADD of requests, XLEN)."""
    stats = await client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in stats.items()
            if name not in ("cmdstat_xlen", "cmdstat_info")}


def _print_burst(label: str, n: int, fig: dict[str, float]) -> None:
    per_debate = 1024 * (fig["peak"] - fig["idle"]) / max(fig["inflight"], 1)
    print(f"  {label:<20} {n:>6} debates: in flight (peak) {fig['inflight']:6.0f}   "
          f"{n / fig['elapsed']:6.0f} debates/s   burst {fig['elapsed']:5.1f} s vs ideal "
          f"{fig['ideal']:4.1f} s ({fig['elapsed'] / fig['ideal']:.2f}×; published in "
          f"{fig['published']:.1f} s)   RSS idle "
          f"{fig['idle'] / 1024:4.0f} MiB, peak {fig['peak'] / 1024:5.0f} MiB, after "
          f"{fig['after'] / 1024:5.0f} MiB   {per_debate / 1024:5.1f} KiB per in-flight debate"
          + (f"   FAILED {fig['failed']:.0f}" if fig["failed"] else ""), flush=True)
    print(f"    worker CPU {fig['cpu_ms']:.2f} ms per debate, of which cyclic GC "
          f"{1000 * fig['gc_s'] / n:.2f} ms ({fig['gc_s']:.1f} s, {fig['full_gcs']:.0f} full "
          "collections); Redis commands per debate (the "
          "requests' XADD, and commands run by scripts, included): " + ", ".join(
        f"{name[6:]} {count:.2f}" for name, count in fig.items() if name.startswith("redis ")),
        flush=True)


STORES = {"durable default (Redis)": "default", "memory:// checkpoints": "memory://"}


def inflight_section(args: argparse.Namespace) -> None:
    print(f"in-flight capacity: one worker, --concurrency {args.concurrency}, {args.rounds}-round "
          f"instant-debate shape, {args.call_latency:g} s per model call, cyclic GC "
          f"{collector_of(args)}; load average "
          f"{os.getloadavg()[0]:.2f}, CPUs {os.cpu_count()}", flush=True)
    redis_server = RedisServer.start(appendonly=False)
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        for attempt in range(args.repeat):
            for n in args.burst_sizes:
                for label, store in STORES.items():
                    if store not in args.stores:
                        continue
                    fig = asyncio.run(_burst(redis_server.url, args, store, n))
                    runs.setdefault((label, n), []).append(fig)
                    _print_burst(f"run {attempt + 1} {label}", n, fig)
        if args.trace_debates:
            asyncio.run(_trace(redis_server.url, args))
    finally:
        redis_server.stop()
    if args.repeat > 1:
        print(f"median of {args.repeat} runs (by burst time):")
        for (label, n), figs in runs.items():
            _print_burst(label, n, sorted(figs, key=lambda f: f["elapsed"])[len(figs) // 2])


async def _trace(url: str, args: argparse.Namespace) -> None:
    """In process: ``--trace-debates`` debates in flight, half-way through, against the worker
    before the burst; what they hold, by file:line. Calls take ``--trace-latency`` s so that every
    debate is in flight at once despite tracemalloc's slowness. Then the rest of their calls are
    instant, and what the worker still holds once they are all answered would be a leak."""
    import redis.asyncio as redis

    n, counts = args.trace_debates, [0, 0, 0]
    stream = f"trace{uuid.uuid4().hex[:6]}:request"
    llm = SleepyLLM(0.0, counts)  # a quick warm-up debate
    bus = sleepy_bus(url, stream, args, "default", llm)
    client = redis.Redis.from_url(url)
    async with bus:
        serving = asyncio.create_task(bus.run())
        await _publish(client, stream, 1, "warm")
        await _wait_settled(client, stream, 1, 120)
        calls, llm.latency_s = counts[CALLS], args.trace_latency
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        half_way = asyncio.Event()  # set when the debates made half their calls
        llm.on_call = lambda made: made >= calls + n * calls // 2 and half_way.set()
        await _publish(client, stream, n, "trace")
        await half_way.wait()
        inflight, after = counts[NOW], tracemalloc.take_snapshot()
        llm.latency_s = 0.0
        await _wait_settled(client, stream, n + 1, 60 + 2 * calls * args.trace_latency)
        gc.collect()
        answered = tracemalloc.take_snapshot()
        tracemalloc.stop()
        bus.stop()
        await serving
    await client.delete(stream, f"event:{stream}:completed", f"event:{stream}:failed")
    await client.aclose()
    _print_trace(before, after, inflight, args.trace_top)
    left = answered.compare_to(before, "lineno")
    print(f"  once all {n} are answered, the worker still holds "
          f"{sum(stat.size_diff for stat in left) / n:.0f} B per debate; top 3 by file:line: "
          + ", ".join(f"{_short(stat.traceback[0].filename)}:{stat.traceback[0].lineno} "
                      f"{stat.size_diff / n:.0f} B" for stat in left[:3]))


def _print_trace(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, inflight: int,
                 top: int) -> None:
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__),
              tracemalloc.Filter(False, linecache.__file__)]
    before, after, per = before.filter_traces(ignore), after.filter_traces(ignore), max(inflight, 1)
    by_line = after.compare_to(before, "lineno")
    print(f"tracemalloc, in process: {inflight} debates in flight half-way through hold "
          f"{sum(stat.size_diff for stat in by_line) / per / 1024:.1f} KiB each (Python "
          "allocations, against the worker before the burst). Per debate, by file:")
    for stat in after.compare_to(before, "filename")[:top // 2]:
        print(f"  {stat.size_diff / per:8.0f} B  {stat.count_diff / per:6.1f} blocks  "
              f"{_short(stat.traceback[0].filename)}")
    print(f"  top {top} by file:line:")
    for stat in by_line[:top]:
        frame = stat.traceback[0]
        print(f"  {stat.size_diff / per:8.0f} B  {stat.count_diff / per:6.1f} blocks  "
              f"{_short(frame.filename)}:{frame.lineno}  "
              f"{linecache.getline(frame.filename, frame.lineno).strip()[:60]}")


def _short(filename: str) -> str:
    return filename.replace(str(ROOT) + os.sep, "").replace(sys.prefix + os.sep, "")


SECTIONS = {"inflight": inflight_section, "ratelimit": ratelimit_section, "cluster": cluster_section,
            "kafka": kafka_section}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=sorted(SECTIONS), action="append")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--callers", type=int, default=32, help="concurrent calls per process")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per model call")
    parser.add_argument("--rpm", type=float, default=600.0,
                        help="requests per 'minute' (the requests-bind run)")
    parser.add_argument("--tpm", type=float, default=60_000.0,
                        help="tokens per 'minute' (the tokens-bind run)")
    parser.add_argument("--period", type=float, default=10.0, help="seconds in a 'minute'")
    parser.add_argument("--burst", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=25_000,
                        help="the in-flight worker's concurrency")
    parser.add_argument("--burst-sizes", type=int, nargs="+", default=[5_000],
                        help="debates per burst (e.g. 5000 20000)")
    parser.add_argument("--stores", nargs="+", default=list(STORES.values()),
                        help="checkpoint stores of the in-flight runs ('default': the durable "
                        "default, in the broker's Redis)")
    parser.add_argument("--lease-ttl", type=float, default=0.0,
                        help="the durable handler's lease_ttl_s (0: its default; leases are "
                        "renewed every third of it)")
    parser.add_argument("--gc-thresholds", type=int, nargs=3,
                        help="the in-flight worker's collector thresholds (default: debatebus's, "
                        f"{' '.join(map(str, DEFAULT_COLLECTOR.thresholds or ()))})")
    parser.add_argument("--python-gc", action="store_true",
                        help="the in-flight worker leaves Python's collector as it is "
                        "(Collector(freeze=False, thresholds=None))")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per debate")
    parser.add_argument("--call-latency", type=float, default=2.0, help="seconds per model call")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each in-flight burst")
    parser.add_argument("--trace-debates", type=int, default=1_000,
                        help="debates in flight for the tracemalloc snapshot (0: none)")
    parser.add_argument("--trace-latency", type=float, default=10.0,
                        help="seconds per model call in the tracemalloc run")
    parser.add_argument("--trace-top", type=int, default=15)
    args = parser.parse_args()
    for section in args.section or sorted(SECTIONS):
        SECTIONS[section](args)


if __name__ == "__main__":
    main()
