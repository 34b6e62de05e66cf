"""Retries, timeouts, error mapping and the redaction of errors shared by every provider.

Each provider supplies one *classifier* (its counterpart of httpx's ``map_httpcore_exceptions``):
a function turning one of its SDK's exceptions into a ``ProviderFailure`` — the ``LLMError`` to
raise, whether the call may be retried, and the server's Retry-After. ``call_with_retries`` does the
rest: a hard per-attempt timeout, a cap on the whole call over all its attempts, exponential backoff
with full jitter, Retry-After, redaction (``debatebus._redaction``) of every message in the exception
chain, and the SDK exception kept as ``__cause__``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

from debatebus._backoff import full_jitter
from debatebus._redaction import redact
from debatebus.exceptions import LLMError, LLMRateLimitError, LLMResponseError, LLMTimeoutError

T = TypeVar("T")

DEFAULT_TIMEOUT = 60.0
"""Seconds one attempt may take."""
DEFAULT_TOTAL_TIMEOUT = 120.0
"""Seconds one call may take over all its attempts and the waits between them: a hanging provider
costs two attempts, not ``max_retries + 1``."""


class Redactor:
    """Masks secrets (``debatebus._redaction``) in text and, in place, in every exception of a chain
    (``__cause__``/``__context__``).

    The SDK exceptions stay as ``__cause__`` so callers can inspect status codes, but their messages
    may quote the key (OpenAI echoes part of a rejected key), so their ``args``, ``message`` and
    ``body`` are masked too before anyone can print the traceback.
    """

    __slots__ = ("_secrets",)

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        self._secrets = tuple(s for s in secrets if s)

    def __call__(self, text: str) -> str:
        return redact(text, self._secrets)

    def __repr__(self) -> str:
        return f"Redactor({len(self._secrets)} secrets)"

    def scrub(self, exc: BaseException) -> None:
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            self._scrub_one(current)
            current = current.__cause__ or current.__context__

    def _scrub_one(self, exc: BaseException) -> None:
        exc.args = tuple(self._clean(arg) for arg in exc.args)
        for name in ("message", "body"):
            value = getattr(exc, name, None)
            if value is not None:
                with contextlib.suppress(AttributeError):  # read-only: nothing we can mask
                    setattr(exc, name, self._clean(value))

    def _clean(self, value: object) -> object:
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {key: self._clean(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self._clean(item) for item in value]
        return value


def parse_retry_after(
    headers: Mapping[str, str] | None, *, now: datetime | None = None
) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, or ``Retry-After`` (seconds or date)."""
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(float(millis) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


# Headers of a provider's rate limits: (remaining, when it refills). OpenAI writes the reset as a
# duration ("6m0s", "20ms"; a bare number is seconds), Anthropic as an RFC 3339 time.
_RESET_HEADERS = (
    ("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
    ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
    ("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset"),
    ("anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset"),
    ("anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-input-tokens-reset"),
    ("anthropic-ratelimit-output-tokens-remaining", "anthropic-ratelimit-output-tokens-reset"),
)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s|)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0}


def _reset_seconds(value: str, now: datetime) -> float | None:
    parts = _DURATION.findall(value)
    if parts and "".join(number + unit for number, unit in parts) == value.strip():
        return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - now).total_seconds(), 0.0)


def parse_rate_limit_reset(
    headers: Mapping[str, str] | None, *, now: datetime | None = None
) -> float | None:
    """Seconds until an exhausted rate limit refills: the longest reset among the limits whose
    ``x-ratelimit-remaining-*`` (OpenAI) or ``anthropic-ratelimit-*-remaining`` header is 0; None
    when no limit is reported exhausted."""
    if not headers:
        return None
    now = now or datetime.now(UTC)
    waits = []
    for remaining, reset in _RESET_HEADERS:
        value = headers.get(reset)
        if headers.get(remaining, "").strip() == "0" and value:
            seconds = _reset_seconds(value, now)
            if seconds is not None:
                waits.append(seconds)
    return max(waits, default=None)


RateLimitReporter = Callable[[float], Awaitable[None]]
_rate_limit_reporter: contextvars.ContextVar[RateLimitReporter | None] = contextvars.ContextVar(
    "debatebus_rate_limit_reporter", default=None)


@contextlib.contextmanager
def reporting_rate_limits(report: RateLimitReporter) -> Iterator[None]:
    """Within this block, ``call_with_retries`` awaits ``report(seconds)`` each time a provider
    says its rate limit stays exhausted for ``seconds`` (``ProviderFailure.pause``), before waiting
    to retry. ``RateLimitedLLM`` passes its limiter's ``penalize``, so the whole fleet waits."""
    token = _rate_limit_reporter.set(report)
    try:
        yield
    finally:
        _rate_limit_reporter.reset(token)


async def _report_pause(failure: ProviderFailure) -> None:
    report = _rate_limit_reporter.get()
    if report is not None and failure.pause is not None:
        await report(failure.pause)


async def _asyncio_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry. ``sleep`` and ``jitter`` are injectable for tests.

    ``total_timeout`` caps one call over all its attempts and the waits between them (None: no
    cap). A server asking to wait longer than ``max_retry_after``, or than what remains of
    ``total_timeout``, fails the call at once.
    """

    max_retries: int = 3
    timeout: float | None = DEFAULT_TIMEOUT  # per attempt, enforced by asyncio
    total_timeout: float | None = DEFAULT_TOTAL_TIMEOUT
    base_delay: float = 0.5
    max_delay: float = 20.0
    max_retry_after: float = 60.0  # a server asking for a longer wait fails the call at once
    sleep: Callable[[float], Awaitable[None]] = field(default=_asyncio_sleep, repr=False)
    jitter: Callable[[], float] = field(default=random.random, repr=False)

    def delay(self, retry_index: int, retry_after: float | None) -> float:
        """Seconds before retry number ``retry_index`` (0-based): the server's Retry-After, else
        exponential backoff."""
        if retry_after is not None:
            return retry_after
        return full_jitter(retry_index, self.base_delay, self.max_delay, self.jitter)


class _Budget:
    """What remains of a call's ``total_timeout``."""

    __slots__ = ("_deadline", "total")

    def __init__(self, total: float | None) -> None:
        self.total = total
        self._deadline = None if total is None else time.monotonic() + total

    def remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def attempt_timeout(self, per_attempt: float | None) -> tuple[float | None, bool]:
        """The next attempt's timeout, and whether it is cut short by the total budget."""
        left = self.remaining()
        if left is None or (per_attempt is not None and per_attempt <= left):
            return per_attempt, False
        return left, True

    def allows(self, wait: float) -> bool:
        """Whether waiting ``wait`` seconds still leaves time for another attempt."""
        left = self.remaining()
        return left is None or wait < left


@dataclass(slots=True)
class ProviderFailure:
    """One failed attempt, translated: what to raise, and whether trying again may help."""

    error: LLMError
    cause: BaseException
    retryable: bool = False
    retry_after: float | None = None
    # A 429's seconds until the provider's limit refills (Retry-After, else x-ratelimit-* reset):
    # what a shared rate limiter pauses every caller for.
    pause: float | None = None


Classifier = Callable[[BaseException], ProviderFailure | None]
"""Maps a provider SDK exception to a ProviderFailure; returns None for exceptions it doesn't own."""


def failure_for_status(
    model: str,
    status: int,
    detail: str,
    cause: BaseException,
    headers: Mapping[str, str] | None = None,
) -> ProviderFailure:
    """The shared HTTP-status policy: 429, 408 and 5xx are transient; other 4xx are not."""
    prefix = f"{model}: HTTP {status}"
    retry_after = parse_retry_after(headers)
    if status == 429:
        error: LLMError = LLMRateLimitError(f"{prefix} rate limited: {detail}")
        pause = retry_after if retry_after is not None else parse_rate_limit_reset(headers)
        return ProviderFailure(error, cause, retryable=True, retry_after=retry_after, pause=pause)
    if status == 408:
        return ProviderFailure(LLMTimeoutError(f"{prefix} request timeout: {detail}"), cause, True)
    if status >= 500:
        error = LLMError(f"{prefix} server error: {detail}")
        return ProviderFailure(error, cause, retryable=True, retry_after=retry_after)
    hint = " (check the API key)" if status in (401, 403) else ""
    return ProviderFailure(LLMError(f"{prefix} request rejected{hint}: {detail}"), cause)


def _timeout_failure(model: str, policy: RetryPolicy, limit: float | None, cut_by_total: bool,
                     cause: BaseException) -> ProviderFailure:
    if cut_by_total:
        message = (f"{model}: no answer within total_timeout={policy.total_timeout:g}s, the cap "
                   "on one call over all its retries (a provider's total_timeout= raises it)")
    else:
        within = f"{limit:g}s" if limit is not None else "the SDK's timeout"
        message = f"{model}: no answer within {within}"
    return ProviderFailure(LLMTimeoutError(message), cause, retryable=not cut_by_total)


def _final_error(failure: ProviderFailure, attempts: int, redactor: Redactor,
                 note: str = "") -> LLMError:
    error = failure.error
    message = str(error)
    if attempts > 1 or note:
        message += f" (gave up after {attempts} attempt{'s' if attempts > 1 else ''}{note})"
    error.args = (redactor(message),)
    redactor.scrub(failure.cause)
    return error


def _wait_refused(model: str, failure: ProviderFailure, cap: float, cap_name: str,
                  redactor: Redactor) -> LLMRateLimitError:
    """The error for a Retry-After longer than we are willing to wait."""
    error = LLMRateLimitError(redactor(
        f"{model}: provider asked to wait {failure.retry_after:g} s, more than the cap "
        f"{cap:g} s ({cap_name}): {failure.error}"))
    error.usage = failure.error.usage
    redactor.scrub(failure.cause)
    return error


def _next_delay(model: str, policy: RetryPolicy, budget: _Budget, number: int,
                failure: ProviderFailure, redactor: Redactor) -> float:
    """Seconds to wait before attempt ``number + 1``; raises when the call must stop instead."""
    if not failure.retryable or number > policy.max_retries:
        raise _final_error(failure, number, redactor) from failure.cause
    left = budget.remaining()
    if failure.retry_after is not None:
        if failure.retry_after > policy.max_retry_after:
            raise _wait_refused(model, failure, policy.max_retry_after, "max_retry_after",
                                redactor) from failure.cause
        if left is not None and failure.retry_after >= left:
            raise _wait_refused(model, failure, left,
                                f"what remains of total_timeout={budget.total:g}s",
                                redactor) from failure.cause
    delay = policy.delay(number - 1, failure.retry_after)
    if not budget.allows(delay):
        note = f"; total_timeout={budget.total:g}s reached"
        raise _final_error(failure, number, redactor, note) from failure.cause
    return delay


async def call_with_retries(
    attempt: Callable[[], Awaitable[T]],
    *,
    model: str,
    policy: RetryPolicy,
    classify: Classifier,
    redactor: Redactor,
) -> T:
    """Await ``attempt()`` until it succeeds, retrying transient failures as ``policy`` allows,
    within the policy's ``total_timeout``.

    ``LLMError``s raised by ``attempt`` itself (e.g. a malformed response) are final. Exceptions the
    classifier doesn't recognise are bugs and propagate unchanged.
    """
    budget = _Budget(policy.total_timeout)
    number = 0
    while True:
        number += 1
        limit, cut_by_total = budget.attempt_timeout(policy.timeout)
        try:
            async with asyncio.timeout(limit):
                return await attempt()
        except LLMError as exc:
            redactor.scrub(exc)
            raise
        except TimeoutError as exc:
            failure = classify(exc) or _timeout_failure(model, policy, limit, cut_by_total, exc)
        except Exception as exc:
            classified = classify(exc)
            if classified is None:
                raise
            failure = classified
        await _report_pause(failure)
        await policy.sleep(_next_delay(model, policy, budget, number, failure, redactor))


def map_sdk_error(exc: BaseException, sdk: Any, base_error: type[BaseException],
                  detail: Callable[[Any], str], *, model: str,
                  base_url: str) -> ProviderFailure | None:
    """Translate an ``openai`` or ``anthropic`` SDK exception into our tree (None for anything
    else). Both SDKs share these exception names; ``base_error`` is the SDK's root class and
    ``detail`` reads a status error's message."""
    if isinstance(exc, sdk.APITimeoutError):
        return ProviderFailure(
            LLMTimeoutError(f"{model}: request to {base_url} timed out"), exc, True
        )
    if isinstance(exc, sdk.APIConnectionError):
        return ProviderFailure(LLMError(f"{model}: cannot reach {base_url}: {exc}"), exc, True)
    if isinstance(exc, sdk.APIStatusError):
        return failure_for_status(model, exc.status_code, detail(exc), exc, exc.response.headers)
    # JSONDecodeError: the SDK parsed a 200 body that isn't JSON.
    if isinstance(exc, json.JSONDecodeError | sdk.APIResponseValidationError):
        return ProviderFailure(LLMResponseError(f"{model}: malformed response: {exc}"), exc)
    if isinstance(exc, base_error):
        return ProviderFailure(LLMError(f"{model}: {exc}"), exc)
    return None

