"""``with_rate_limits``: a model behind the rate limit its name has, counted in this process
(``MemoryRateLimiter``) or shared through Redis by every worker (``RedisRateLimiter``).

It sits above both limiters: the Redis one builds on ``debatebus.llm._ratelimit``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from debatebus.llm._base import LLM, model_name
from debatebus.llm._ratelimit import (
    ENV_VAR,
    MemoryRateLimiter,
    RateLimit,
    RateLimitedLLM,
    RateLimiter,
    WaitObserver,
    parse_rate_limits,
)


def with_rate_limits(llm: LLM, limits: Mapping[str, RateLimit] | str | None = None, *,
                     redis_url: str | None = None, prefix: str = "debatebus",
                     on_wait: WaitObserver | None = None) -> LLM:
    """``llm`` behind the limit for its model name (else ``*``), or ``llm`` itself when none
    applies. ``limits`` defaults to ``$DEBATEBUS_RATE_LIMITS``. With ``redis_url`` the limit is
    shared through Redis by every worker on it; without, it holds for this process only (and for
    this one returned LLM: wrap each model once and share the result)."""
    if limits is None:
        limits = os.environ.get(ENV_VAR, "")
    table = parse_rate_limits(limits) if isinstance(limits, str) else limits
    name = model_name(llm)
    limit = table.get(name) or table.get("*")
    if limit is None:
        return llm
    limiter: RateLimiter
    if redis_url:  # imported here: Redis is an optional extra (debatebus[redis])
        from debatebus.llm._ratelimit_redis import RedisRateLimiter

        limiter = RedisRateLimiter(redis_url, name, limit, prefix=prefix, on_wait=on_wait)
    else:
        limiter = MemoryRateLimiter(name, limit, on_wait=on_wait)
    return RateLimitedLLM(llm, limiter)
