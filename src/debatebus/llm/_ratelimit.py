"""Fleet-wide rate limits per model: calls wait for budget instead of hitting the provider's 429s.

``RateLimitedLLM(llm, limiter)`` is an LLM that asks ``limiter`` for one request and an estimate of
its tokens before each call, corrects the estimate with the response's usage after it, and tells the
limiter when the provider answers 429 with a Retry-After (or exhausted ``x-ratelimit-*`` headers),
so that every caller sharing the limiter pauses for that long.

Limiters: ``MemoryRateLimiter`` counts for one process; ``RedisRateLimiter``
(``debatebus.llm._ratelimit_redis``) keeps one token bucket in Redis, shared by every worker that
uses the same Redis and limit name. ``debatebus.llm._rate_limits.with_rate_limits`` builds either
from a ``RateLimit`` table such as ``$DEBATEBUS_RATE_LIMITS``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import math
import random
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from debatebus._loops import PerLoop
from debatebus._usage import TokenUsage
from debatebus.exceptions import ConfigError, LLMError, TransportError
from debatebus.llm._base import LLM, LLMRequest, LLMResponse, LLMStream, Piece, model_name
from debatebus.llm._retry import reporting_rate_limits

log = logging.getLogger("debatebus.llm.ratelimit")

ENV_VAR = "DEBATEBUS_RATE_LIMITS"
#: Longest sleep between two asks for budget: a waiting caller sees a refund or a release this soon.
MAX_POLL_S = 0.25
#: How often a caller blocked only by ``max_concurrent`` asks again.
CONCURRENCY_POLL_S = 0.02

WaitObserver = Callable[[str, float], None]
"""Told ``(limit name, seconds waited)`` after every granted ``acquire``, zero waits included."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A provider's limits for one model: requests and tokens per minute, calls in flight.

    Each per-minute limit is a token bucket refilled continuously at limit/``period_s`` per second
    that holds at most ``burst`` × limit, as providers' own limits work. ``burst`` below 1 keeps a
    quiet fleet from spending a whole minute's budget at once (for providers that enforce
    per-second slices). ``period_s`` is the minute's length: 60 except in tests and benchmarks.
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_concurrent: int | None = None
    burst: float = 1.0
    period_s: float = 60.0

    def __post_init__(self) -> None:
        if (self.requests_per_minute, self.tokens_per_minute, self.max_concurrent) == (
                None, None, None):
            raise ConfigError(
                "RateLimit needs requests_per_minute, tokens_per_minute or max_concurrent")
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"RateLimit {name} must be a positive number, not {value!r}")
        concurrent = self.max_concurrent
        if concurrent is not None and (isinstance(concurrent, bool) or not isinstance(
                concurrent, int) or concurrent < 1):
            raise ConfigError(f"RateLimit max_concurrent must be an int >= 1, not {concurrent!r}")
        if not 0.0 < self.burst <= 1.0:
            raise ConfigError(f"RateLimit burst must be in (0, 1], not {self.burst!r}")
        if not (math.isfinite(self.period_s) and self.period_s > 0):
            raise ConfigError(f"RateLimit period_s must be positive, not {self.period_s!r}")

    def rate(self, per_minute: float | None) -> float:
        """Units per second a per-minute limit refills at (0 when unlimited)."""
        return 0.0 if per_minute is None else per_minute / self.period_s

    def capacity(self, per_minute: float | None) -> float:
        """What a per-minute limit's bucket holds when full (0 when unlimited)."""
        return 0.0 if per_minute is None else per_minute * self.burst


@dataclass(slots=True)
class Permit:
    """One granted ``acquire``: what it took, to ``settle`` and ``release`` later."""

    tokens: int
    holder: str = field(default_factory=lambda: uuid.uuid4().hex)
    waited_s: float = 0.0
    settled: bool = False
    released: bool = False


class RateLimiter(abc.ABC):
    """Budget for one named limit. ``acquire`` waits until the budget allows a call and takes it;
    ``settle`` corrects the tokens taken with what the call used; ``release`` frees its
    ``max_concurrent`` slot; ``penalize`` pauses every caller (a provider's Retry-After).

    Subclasses implement one non-blocking attempt (``_try_acquire``), ``_adjust_tokens``,
    ``_release``, ``penalize`` and ``close``.
    """

    def __init__(self, name: str, limit: RateLimit, *, on_wait: WaitObserver | None = None) -> None:
        if not name or "{" in name or "}" in name:
            raise ConfigError(f"a rate limit name must be non-empty, without braces: {name!r}")
        self.name = name
        self.limit = limit
        self._on_wait = on_wait
        # One waiter of this process asks at a time, the others queue behind it in arrival order:
        # nobody starves, and a worker with hundreds of waiting calls sends one ask, not hundreds.
        self._turn = PerLoop(asyncio.Lock)

    async def acquire(self, requests: int = 1, tokens: int = 0) -> Permit:
        """Wait until ``requests`` requests and ``tokens`` tokens are available, and take them.

        A call asking for more than a full bucket waits for a full bucket and leaves it in debt.
        Callers in one process are served in arrival order; across processes, whoever asks first
        after a refill. Cancelling the wait takes nothing."""
        permit = Permit(tokens)
        started = time.monotonic()
        async with self._turn.get():
            while True:
                wait = await self._try_acquire(permit, requests)
                if wait <= 0:
                    break
                # Jitter spreads processes that computed the same refill time.
                await asyncio.sleep(min(wait, MAX_POLL_S) * (1.0 + 0.1 * random.random()))
        permit.waited_s = time.monotonic() - started
        if self._on_wait is not None:
            self._on_wait(self.name, permit.waited_s)
        return permit

    async def settle(self, permit: Permit, actual_tokens: int) -> None:
        """Correct the token bucket by ``actual_tokens - permit.tokens`` (once per permit)."""
        if permit.settled:
            return
        permit.settled = True
        if self.limit.tokens_per_minute is not None and actual_tokens != permit.tokens:
            await self._adjust_tokens(actual_tokens - permit.tokens)

    async def release(self, permit: Permit) -> None:
        """Free the permit's ``max_concurrent`` slot (once per permit)."""
        if permit.released:
            return
        permit.released = True
        if self.limit.max_concurrent is not None:
            await self._release(permit)

    @abc.abstractmethod
    async def penalize(self, seconds: float) -> None:
        """Grant nothing to anyone for ``seconds``; a pause already running longer stays."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release what the limiter holds (connections)."""

    @abc.abstractmethod
    async def _try_acquire(self, permit: Permit, requests: int) -> float:
        """Take the budget and return 0, or take nothing and return seconds worth waiting."""

    @abc.abstractmethod
    async def _adjust_tokens(self, delta: int) -> None:
        """Take ``delta`` more tokens from the bucket (give back when negative)."""

    @abc.abstractmethod
    async def _release(self, permit: Permit) -> None:
        """Free the concurrency slot ``permit`` holds."""


@dataclass(slots=True)
class _Bucket:
    """A continuously refilled token bucket; ``level`` may go below 0 (debt)."""

    rate: float
    capacity: float
    level: float
    stamp: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + max(now - self.stamp, 0.0) * self.rate)
        self.stamp = now

    def wait_for(self, need: float) -> float:
        want = min(need, self.capacity)
        return 0.0 if self.level >= want else (want - self.level) / self.rate


class MemoryRateLimiter(RateLimiter):
    """A limit counted in this process only: what a Kafka-only fleet gets (each worker enforces
    the whole limit on its own, so divide the provider's limit by the number of workers)."""

    def __init__(self, name: str, limit: RateLimit, *, on_wait: WaitObserver | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name, limit, on_wait=on_wait)
        self._clock = clock
        now = clock()
        self._buckets: dict[str, _Bucket] = {}
        for kind, per_minute in (("requests", limit.requests_per_minute),
                                 ("tokens", limit.tokens_per_minute)):
            if per_minute is not None:
                full = limit.capacity(per_minute)
                self._buckets[kind] = _Bucket(limit.rate(per_minute), full, full, now)
        self._blocked_until = 0.0
        self._holders: set[str] = set()

    async def _try_acquire(self, permit: Permit, requests: int) -> float:
        now = self._clock()
        need = {"requests": requests, "tokens": permit.tokens}
        wait = max(self._blocked_until - now, 0.0)
        for kind, bucket in self._buckets.items():
            bucket.refill(now)
            wait = max(wait, bucket.wait_for(need[kind]))
        concurrent = self.limit.max_concurrent
        if concurrent is not None and len(self._holders) >= concurrent:
            wait = max(wait, CONCURRENCY_POLL_S)
        if wait > 0:
            return wait
        for kind, bucket in self._buckets.items():
            bucket.level -= need[kind]
        if concurrent is not None:
            self._holders.add(permit.holder)
        return 0.0

    async def _adjust_tokens(self, delta: int) -> None:
        bucket = self._buckets["tokens"]
        bucket.refill(self._clock())
        bucket.level = min(bucket.capacity, bucket.level - delta)

    async def _release(self, permit: Permit) -> None:
        self._holders.discard(permit.holder)

    async def penalize(self, seconds: float) -> None:
        self._blocked_until = max(self._blocked_until, self._clock() + max(seconds, 0.0))

    async def close(self) -> None:
        """Nothing to release: the buckets are this object's own fields."""


def estimate_tokens(request: LLMRequest, *, default_max_tokens: int,
                    chars_per_token: float = 4.0) -> int:
    """Tokens a call may use before it is made: its text's length / ``chars_per_token`` plus the
    answer's cap (``request.max_tokens``, else ``default_max_tokens``)."""
    chars = len(request.system) + sum(len(message.content) for message in request.messages)
    return math.ceil(chars / chars_per_token) + (request.max_tokens or default_max_tokens)


class _Limiter(Protocol):
    name: str

    async def close(self) -> None: ...


L = TypeVar("L", bound=_Limiter)


@dataclass(slots=True)
class LimitedCall:
    """One call under a limit (``LimitedLLM._limited``): its usage, once the answer is in."""

    usage: TokenUsage | None = None


class LimitedLLM(LLM, Generic[L]):
    """What a model wrapped by a limiter of kind ``L`` is, whatever the limiter counts: the
    model's name, the limiter, how a call's tokens are estimated before it is made
    (``estimate_tokens``, with ``default_max_tokens`` for a request without ``max_tokens``), and
    how a call goes through the limit: ``complete``, and ``stream`` until its stream ends, both
    inside ``_limited``. ``RateLimitedLLM`` and ``SpendLimitedLLM`` say what ``_limited`` does
    around a call."""

    def __init__(self, llm: LLM, limiter: L, *, default_max_tokens: int = 1024,
                 chars_per_token: float = 4.0) -> None:
        if default_max_tokens < 1 or chars_per_token <= 0:
            raise ConfigError("default_max_tokens must be >= 1 and chars_per_token positive")
        self._llm = llm
        self._limiter = limiter
        self._default_max_tokens = default_max_tokens
        self._chars_per_token = chars_per_token

    @property
    def model(self) -> str:
        return model_name(self._llm)

    @property
    def limiter(self) -> L:
        return self._limiter

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._llm!r}, limit={self._limiter.name!r})"

    def _estimate(self, request: LLMRequest, answer: int | None = None) -> int:
        """The tokens ``request`` will take: its prompt's and an answer of ``answer`` tokens
        (None: its ``max_tokens``, else ``default_max_tokens``)."""
        return estimate_tokens(request, default_max_tokens=answer or self._default_max_tokens,
                               chars_per_token=self._chars_per_token)

    async def complete(self, request: LLMRequest) -> LLMResponse:
        async with self._limited(request) as call:
            with self._calling():
                response = await self._llm.complete(request)
            call.usage = response.usage
        return response

    def stream(self, request: LLMRequest, *, interval_s: float = 0.0) -> LLMStream:
        """The wrapped model's stream, limited and accounted for as ``complete`` is: the call is
        in the limit until its stream ends (or is left)."""
        return LLMStream(self._streamed(request, interval_s))

    async def _streamed(self, request: LLMRequest,
                        interval_s: float) -> AsyncGenerator[Piece, None]:
        async with (self._limited(request) as call,
                    self._llm.stream(request, interval_s=interval_s) as pieces):
            while True:
                with self._calling():  # each step, not across a yield: the caller runs there
                    piece = await anext(pieces, None)
                if piece is None:
                    break
                yield piece
            response = pieces.response
            assert response is not None  # the stream ended
            call.usage = response.usage
        yield response

    @abc.abstractmethod
    def _limited(self, request: LLMRequest) -> contextlib.AbstractAsyncContextManager[LimitedCall]:
        """Around one call of ``request``: waits or refuses before it, and counts what it used
        after (``LimitedCall.usage``, else an ``LLMError``'s, else an estimate)."""

    def _calling(self) -> contextlib.AbstractContextManager[None]:
        """Around each step of the wrapped model's call (by default nothing)."""
        return contextlib.nullcontext()

    async def aclose(self) -> None:
        """Close the limiter, and the wrapped LLM when it has ``aclose``."""
        await self._limiter.close()
        close = getattr(self._llm, "aclose", None)
        if close is not None:
            await close()


class RateLimitedLLM(LimitedLLM[RateLimiter]):
    """``llm`` behind ``limiter``: every call waits for one request and its estimated tokens
    (``estimate_tokens``), is corrected with the response's usage, and holds a ``max_concurrent``
    slot while it runs (a streamed one, until its stream ends). A provider's 429 with a
    Retry-After pauses every caller of the limiter.

    ``default_max_tokens`` is the answer length assumed for requests without ``max_tokens``."""

    @contextlib.asynccontextmanager
    async def _limited(self, request: LLMRequest) -> AsyncIterator[LimitedCall]:
        estimate = self._estimate(request)
        permit = await self._limiter.acquire(tokens=estimate)
        call = LimitedCall()
        try:
            yield call
        except LLMError as exc:
            call.usage = exc.usage
            raise
        finally:
            # Unknown usage (no usage reported, a timeout) keeps the estimate charged.
            await self._finish(permit, estimate if call.usage is None else call.usage.total_tokens)

    def _calling(self) -> contextlib.AbstractContextManager[None]:
        return reporting_rate_limits(self._pause_fleet)

    async def _finish(self, permit: Permit, tokens: int) -> None:
        """Settle and release; a broker failure here must not cost the call its answer (the
        slot then frees itself when its lease ends)."""
        try:
            await self._limiter.settle(permit, tokens)
            await self._limiter.release(permit)
        except TransportError as exc:
            log.warning("rate limit %s: could not settle a call: %s", self._limiter.name, exc)

    async def _pause_fleet(self, seconds: float) -> None:
        try:
            await self._limiter.penalize(seconds)
        except TransportError as exc:  # the call's own retry still waits; only the fleet misses it
            log.warning("rate limit %s: could not share a %.1f s pause: %s",
                        self._limiter.name, seconds, exc)


_KEYS = {"rpm": "requests_per_minute", "tpm": "tokens_per_minute", "concurrent": "max_concurrent",
         "burst": "burst", "period": "period_s"}


def _limit_from(name: str, text: str) -> RateLimit:
    values: dict[str, float | int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, raw = item.partition(":")
        field_name = _KEYS.get(key.strip().lower())
        if field_name is None:
            raise ConfigError(f"rate limit {name!r}: unknown key {key!r} (use {', '.join(_KEYS)})")
        try:
            values[field_name] = int(raw) if field_name == "max_concurrent" else float(raw)
        except ValueError:
            raise ConfigError(f"rate limit {name!r}: {key} needs a number, not {raw!r}") from None
    return RateLimit(**values)  # type: ignore[arg-type]


def parse_rate_limits(text: str) -> dict[str, RateLimit]:
    """``"gpt-4o-mini=rpm:500,tpm:200000,concurrent:50; *=rpm:60"`` → limits by model name.

    Keys: rpm, tpm, concurrent, burst, period (seconds in a "minute"); ``*`` matches any model."""
    limits: dict[str, RateLimit] = {}
    for entry in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, body = entry.rpartition("=")
        if not sep or not name.strip():
            raise ConfigError(f"rate limit {entry!r}: write MODEL=rpm:N,tpm:N,concurrent:N")
        limits[name.strip()] = _limit_from(name.strip(), body)
    return limits
