"""Model-side test helpers: whether llama-cpp-python is installed, a recording sleep for retry
policies, and rate-limiter probes."""

from __future__ import annotations

import asyncio
import importlib.util

from debatebus.llm._ratelimit import RateLimiter

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
NO_LLAMA = "llama-cpp-python is not installed (scripts/install-local-model.sh installs it)"


class Sleeps:
    """A RetryPolicy.sleep that records the delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


async def granted_within(limiter: RateLimiter, seconds: float, **kwargs: int) -> bool:
    try:
        await asyncio.wait_for(limiter.acquire(**kwargs), seconds)
    except TimeoutError:
        return False
    return True


async def granted_now(limiter: RateLimiter, **kwargs: int) -> bool:
    """Whether ``acquire`` succeeds without waiting for a refill: within 2 s, room for a loaded
    machine (and a first connection to Redis), where every case expected to wait needs 5 s and
    more (or a release that never comes)."""
    return await granted_within(limiter, 2.0, **kwargs)
