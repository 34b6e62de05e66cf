"""Objects that outlive an event loop get one asyncio primitive per loop (``PerLoop``)."""

from __future__ import annotations

import asyncio

from debatebus._loops import PerLoop
from debatebus.llm._ratelimit import MemoryRateLimiter, RateLimit


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
