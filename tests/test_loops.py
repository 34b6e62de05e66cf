"""Objects that outlive an event loop get one asyncio primitive per loop (``PerLoop``)."""

from __future__ import annotations

import asyncio

from debatebus.llm.ratelimit import MemoryRateLimiter, RateLimit
from debatebus.loops import PerLoop, SharedCall


def test_each_loop_gets_its_own_and_keeps_it() -> None:
    locks = PerLoop(asyncio.Lock)

    async def twice() -> tuple[asyncio.Lock, asyncio.Lock]:
        return locks.get(), locks.get()

    first, again = asyncio.run(twice())
    assert first is again
    other, _ = asyncio.run(twice())
    assert other is not first


def test_a_rate_limiter_serves_one_loop_after_another() -> None:
    """Callers queued behind one another in a first ``asyncio.run``, then in a second: the
    limiter's queue is not bound to the first loop."""
    limiter = MemoryRateLimiter("m", RateLimit(requests_per_minute=600))

    async def queued() -> int:
        await limiter.penalize(0.05)  # the first caller waits in line, the others behind it
        permits = await asyncio.gather(*(limiter.acquire() for _ in range(3)))
        return len(permits)

    assert asyncio.run(queued()) == 3
    assert asyncio.run(queued()) == 3


async def test_a_shared_call_runs_once_for_concurrent_callers_and_again_after() -> None:
    calls = 0
    gate = asyncio.Event()

    async def load() -> None:
        nonlocal calls
        calls += 1
        await gate.wait()
        if calls == 2:
            raise RuntimeError("refused")

    shared = SharedCall(load)
    waiting = asyncio.gather(*(shared() for _ in range(50)))
    await asyncio.sleep(0)
    gate.set()
    await waiting
    assert calls == 1
    failing = asyncio.gather(*(shared() for _ in range(3)), return_exceptions=True)
    assert [type(e) for e in await failing] == [RuntimeError] * 3  # one call, its error for each
    assert calls == 2
    await shared()  # a failed call is not kept: the next caller calls again
    assert calls == 3
