"""One Redis rate limit shared by 3 worker processes: the fleet gets the configured rate, not 3×,
never holds more than ``max_concurrent`` calls, and a Retry-After pauses every process.

Minutes are shortened with ``period_s`` so each run takes seconds."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
import uuid
from collections import Counter
from typing import Any

from debatebus.llm._ratelimit import RateLimit
from debatebus.llm._ratelimit_redis import RedisRateLimiter

PROCESSES = 3
# process, asked at (before acquire()), granted at, released at (time.time())
Grant = tuple[int, float, float, float]


async def _calls(url: str, name: str, limit: RateLimit, index: int, tasks: int, hold_s: float,
                 end: float) -> list[Grant]:
    limiter = RedisRateLimiter(url, name, limit)
    grants: list[Grant] = []

    async def call() -> None:
        while time.time() < end:
            asked = time.time()
            permit = await limiter.acquire()
            granted = time.time()
            await asyncio.sleep(hold_s)
            released = time.time()
            await limiter.release(permit)
            if granted < end:
                grants.append((index, asked, granted, released))

    await asyncio.gather(*(call() for _ in range(tasks)))
    await limiter.close()
    return grants


def _worker(args: tuple[str, str, RateLimit, int, int, float], barrier: Any, end: Any,
            out: Any) -> None:
    barrier.wait()  # every process is up
    barrier.wait()  # the parent has set the end: one window for the whole fleet
    out.put(asyncio.run(_calls(*args, end.value)))


def run_fleet(url: str, limit: RateLimit, *, tasks: int, hold_s: float, duration_s: float,
              name: str = "") -> tuple[str, float, list[Grant]]:
    """Runs ``PROCESSES`` processes of ``tasks`` callers each, all asking from the start time
    until ``duration_s`` after it; returns the limit name, the start time and every grant. No
    process asks before the start time, and every grant counted came before the end."""
    name = name or f"fleet-{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("spawn")
    barrier, end, out = ctx.Barrier(PROCESSES + 1), ctx.Value("d", 0.0), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(
        (url, name, limit, i, tasks, hold_s), barrier, end, out)) for i in range(PROCESSES)]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=60)
    started = time.time()
    end.value = started + duration_s
    barrier.wait(timeout=60)
    grants = [grant for _ in procs for grant in out.get(timeout=60)]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    return name, started, grants


def test_three_processes_share_one_request_rate(redis_server: Any) -> None:
    # 120 per 3 s: 40/s, a bucket of 12 (burst 0.1). Over the fleet's one 3 s window: 12 + 120 =
    # 132 at most, however late any process starts or stalls.
    limit = RateLimit(requests_per_minute=120, period_s=3.0, burst=0.1)
    _, started, grants = run_fleet(redis_server.url, limit, tasks=8, hold_s=0.0, duration_s=3.0)
    assert 0.9 * 132 <= len(grants) <= 132
    per_second = Counter(int(at - started) for _, _, at, _ in grants)
    assert all(30 <= per_second[second] <= 44 for second in (1, 2)), per_second
    assert len({process for process, _, _, _ in grants}) == PROCESSES  # nobody starved


def test_max_concurrent_holds_across_processes(redis_server: Any) -> None:
    limit = RateLimit(max_concurrent=3)
    _, _, grants = run_fleet(redis_server.url, limit, tasks=4, hold_s=0.05, duration_s=1.5)
    events = sorted([(at, 1) for _, _, at, _ in grants] + [(done, -1) for *_, done in grants],
                    key=lambda event: (event[0], event[1]))
    in_flight, peak = 0, 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak == 3  # reached, never passed
    assert len(grants) >= 30  # 3 slots × 1.5 s / 0.05 s = 90 at best; slots are reused


def test_a_penalty_pauses_every_process(redis_server: Any) -> None:
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    limit = RateLimit(requests_per_minute=6000)  # 100/s: the penalty is the only pause

    limiter = RedisRateLimiter(redis_server.url, name, limit)

    async def penalize() -> None:
        sent = time.time()
        await limiter.penalize(1.0)  # what a 429 with Retry-After: 1 does
        penalized.extend((sent, time.time()))  # the pause began in between
        await limiter.close()

    def penalize_once_running() -> None:
        while not redis_server.client().exists(limiter.keys[0]):  # the fleet's first grant
            time.sleep(0.02)
        time.sleep(0.5)
        asyncio.run(penalize())

    penalized: list[float] = []
    thread = threading.Thread(target=penalize_once_running)
    thread.start()
    _, _, grants = run_fleet(redis_server.url, limit, tasks=2, hold_s=0.0, duration_s=3.0,
                             name=name)
    thread.join()
    sent, answered = penalized
    # Redis paused the fleet at some moment between sent and answered, for 1 s: an acquire()
    # that began after answered cannot be granted before sent + 1.0, however late it is recorded.
    asked_after = [(asked, at) for _, asked, at, _ in grants if asked > answered]
    assert asked_after  # callers kept asking through the pause
    early = [(asked, at) for asked, at in asked_after if at < sent + 1.0]
    assert early == [], (sent, answered)
    after = {process for process, _, at, _ in grants if at > answered + 1.0}
    assert after == set(range(PROCESSES))
