"""Fleet-wide spend limits: at most so much money per time window, whatever the producers send.

``SpendLimitedLLM(llm, limiter, prices)`` asks ``limiter`` before each call whether the current
window's spend has reached its limit, and if it has, fails the call with ``SpendLimitError``
without making it: the debate then fails as retryable (``debateStopReason: "spend_limit"``), and a
resend or ``debatebus replay --failed`` after the window ends runs it again from its last committed
round. After each call, what it cost at ``prices`` is added to the window.

The limit is checked before a call and charged after it, so the calls in flight when it is reached
all complete: a fleet overshoots by at most those calls' cost (one per debate running at that
moment). Windows are fixed (aligned on the epoch: an hour's window starts on the hour).

Limiters: ``MemorySpendLimiter`` counts for one process; ``RedisSpendLimiter``
(``debatebus.llm.spend_redis``) keeps the window's spend in the same Redis as the fleet rate
limiter, shared by every worker with the same ``prefix`` and limit name (an event type, say, or a
team). Wrap every model a debate calls with one limiter to limit that debate's event type.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from debatebus._pricing import Price, Prices
from debatebus._usage import TokenUsage
from debatebus.exceptions import ConfigError, LLMError, SpendLimitError, TransportError
from debatebus.llm._base import LLM, LLMRequest, model_name
from debatebus.llm._ratelimit import LimitedCall, LimitedLLM

log = logging.getLogger("debatebus.llm.spend")


@dataclass(frozen=True, slots=True)
class SpendLimit:
    """At most ``max_cost`` (in ``currency``) spent per window of ``window_s`` seconds."""

    max_cost: float
    window_s: float = 3600.0
    currency: str = "USD"

    def __post_init__(self) -> None:
        for name in ("max_cost", "window_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    math.isfinite(value) and value > 0):
                raise ConfigError(f"SpendLimit {name} must be a positive number, not {value!r}")


@dataclass(frozen=True, slots=True)
class Window:
    """The current window: what was spent in it, and the seconds until it ends."""

    spent: float
    ends_in_s: float


class SpendLimiter(abc.ABC):
    """The spend of one named limit in its current window. Subclasses read the window
    (``window``), add to it (``_add``) and ``close``."""

    def __init__(self, name: str, limit: SpendLimit) -> None:
        if not name or "{" in name or "}" in name:
            raise ConfigError(f"a spend limit name must be non-empty, without braces: {name!r}")
        self.name = name
        self.limit = limit

    async def check(self) -> None:
        """Raise ``SpendLimitError`` when the current window's spend has reached the limit."""
        window = await self.window()
        limit = self.limit
        if window.spent >= limit.max_cost:
            raise SpendLimitError(
                f"spend limit {self.name!r} reached: {window.spent:.4g} {limit.currency} spent "
                f"in its window of {limit.window_s:g} s, whose limit is {limit.max_cost:g}; the "
                f"window ends in {math.ceil(window.ends_in_s)} s: resend the request, or "
                "`debatebus replay --failed`, after that", retry_after_s=window.ends_in_s)

    async def record(self, cost: float) -> None:
        """Add ``cost`` to the current window."""
        if cost > 0:
            await self._add(cost)

    @abc.abstractmethod
    async def window(self) -> Window:
        """The current window's spend and remaining time."""

    @abc.abstractmethod
    async def _add(self, cost: float) -> None:
        """Add ``cost`` (> 0) to the current window."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release what the limiter holds (connections)."""


class MemorySpendLimiter(SpendLimiter):
    """A limit counted in this process only."""

    def __init__(self, name: str, limit: SpendLimit, *,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(name, limit)
        self._clock = clock
        self._index = -1
        self._spent = 0.0

    def _current(self) -> float:
        """Seconds left in the current window, starting a new one (spent 0) when it changed."""
        now = self._clock()
        index = math.floor(now / self.limit.window_s)
        if index != self._index:
            self._index, self._spent = index, 0.0
        return (index + 1) * self.limit.window_s - now

    async def window(self) -> Window:
        left = self._current()
        return Window(self._spent, left)

    async def _add(self, cost: float) -> None:
        self._current()
        self._spent += cost

    async def close(self) -> None:
        """Nothing to release: the spend is this object's own."""


class SpendLimitedLLM(LimitedLLM[SpendLimiter]):
    """``llm`` under ``limiter``: a call is made only while the limiter's window has spend left,
    and what it cost at ``prices`` (which must price ``llm``'s model, in the limit's currency) is
    charged after it. A call whose usage is not known (a timeout, a provider reporting none) is
    charged its estimate: its prompt's length / ``chars_per_token`` at the input price plus the
    answer's cap (``request.max_tokens``, else ``default_max_tokens``) at the output price."""

    def __init__(self, llm: LLM, limiter: SpendLimiter, prices: Prices, *,
                 default_max_tokens: int = 1024, chars_per_token: float = 4.0) -> None:
        name = model_name(llm)
        price = prices.price_of(name)
        if price is None:
            raise ConfigError(f"SpendLimitedLLM needs the price of {name!r}, which prices does "
                              "not have: add it (Prices.updated)")
        if prices.currency != limiter.limit.currency:
            raise ConfigError(f"spend limit {limiter.name!r} is in {limiter.limit.currency}, "
                              f"prices in {prices.currency}: use one currency")
        super().__init__(llm, limiter, default_max_tokens=default_max_tokens,
                         chars_per_token=chars_per_token)
        self._price: Price = price

    @contextlib.asynccontextmanager
    async def _limited(self, request: LLMRequest) -> AsyncIterator[LimitedCall]:
        await self._limiter.check()
        call = LimitedCall()
        try:
            yield call
        except LLMError as exc:  # a failed call may have been billed: what it says, or more
            await self._charge(request, exc.usage)
            raise
        await self._charge(request, call.usage)

    async def _charge(self, request: LLMRequest, usage: TokenUsage | None) -> None:
        if usage is None:
            answer = request.max_tokens or self._default_max_tokens
            usage = TokenUsage.of(self._estimate(request, answer) - answer, answer)
        try:
            await self._limiter.record(self._price.cost(usage))
        except TransportError as exc:  # the answer stands; only the fleet's count misses it
            log.warning("spend limit %s: could not charge a call: %s", self._limiter.name, exc)
