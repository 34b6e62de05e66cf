"""Retries, per-call timeouts, error mapping and secret redaction shared by every provider.

Each provider supplies one *classifier* (its counterpart of httpx's ``map_httpcore_exceptions``):
a function turning one of its SDK's exceptions into a ``ProviderFailure`` — the ``LLMError`` to
raise, whether the call may be retried, and the server's Retry-After. ``call_with_retries`` does the
rest: a hard per-attempt timeout, exponential backoff with full jitter, Retry-After, redaction of
every message in the exception chain, and the SDK exception kept as ``__cause__``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

from debatebus.exceptions import LLMError, LLMRateLimitError, LLMResponseError, LLMTimeoutError

__all__ = [
    "Classifier",
    "ProviderFailure",
    "Redactor",
    "RetryPolicy",
    "call_with_retries",
    "failure_for_status",
    "map_sdk_error",
    "parse_retry_after",
    "redact",
]

T = TypeVar("T")

# sk-… covers OpenAI (sk-, sk-proj-) and Anthropic (sk-ant-) keys; bearer tokens cover the rest.
_KEY_PATTERNS = (
    re.compile(r"sk-[A-Za-z0-9_\-]{6,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=\-]{6,}"),
)
_MASK = "[REDACTED]"


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with API keys (``sk-…``, bearer tokens and every value in ``secrets``) masked."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, _MASK)
    text = _KEY_PATTERNS[0].sub(_MASK, text)
    return _KEY_PATTERNS[1].sub(lambda m: m.group(1) + _MASK, text)


class Redactor:
    """Masks keys in text and, in place, in every exception of a chain (``__cause__``/``__context__``).

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


async def _asyncio_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry. ``sleep`` and ``jitter`` are injectable for tests."""

    max_retries: int = 3
    timeout: float | None = 60.0  # per attempt, enforced by asyncio even if the SDK's is not
    base_delay: float = 0.5
    max_delay: float = 20.0
    max_retry_after: float = 60.0  # a longer Retry-After is ignored in favour of our own backoff
    sleep: Callable[[float], Awaitable[None]] = field(default=_asyncio_sleep, repr=False)
    jitter: Callable[[], float] = field(default=random.random, repr=False)

    def delay(self, retry_index: int, retry_after: float | None) -> float:
        """Seconds before retry number ``retry_index`` (0-based)."""
        if retry_after is not None and 0.0 <= retry_after <= self.max_retry_after:
            return retry_after
        # Full jitter (AWS architecture blog): spreads clients that failed together.
        return self.jitter() * min(self.max_delay, self.base_delay * 2.0**retry_index)


@dataclass(slots=True)
class ProviderFailure:
    """One failed attempt, translated: what to raise, and whether trying again may help."""

    error: LLMError
    cause: BaseException
    retryable: bool = False
    retry_after: float | None = None


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
        return ProviderFailure(error, cause, retryable=True, retry_after=retry_after)
    if status == 408:
        return ProviderFailure(LLMTimeoutError(f"{prefix} request timeout: {detail}"), cause, True)
    if status >= 500:
        error = LLMError(f"{prefix} server error: {detail}")
        return ProviderFailure(error, cause, retryable=True, retry_after=retry_after)
    hint = " (check the API key)" if status in (401, 403) else ""
    return ProviderFailure(LLMError(f"{prefix} request rejected{hint}: {detail}"), cause)


def _timeout_failure(model: str, policy: RetryPolicy, cause: BaseException) -> ProviderFailure:
    limit = f"{policy.timeout:g}s" if policy.timeout is not None else "the SDK's timeout"
    return ProviderFailure(LLMTimeoutError(f"{model}: no answer within {limit}"), cause, True)


def _final_error(failure: ProviderFailure, attempts: int, redactor: Redactor) -> LLMError:
    error = failure.error
    message = str(error)
    if attempts > 1:
        message += f" (gave up after {attempts} attempts)"
    error.args = (redactor(message),)
    redactor.scrub(failure.cause)
    return error


async def call_with_retries(
    attempt: Callable[[], Awaitable[T]],
    *,
    model: str,
    policy: RetryPolicy,
    classify: Classifier,
    redactor: Redactor,
) -> T:
    """Await ``attempt()`` until it succeeds, retrying transient failures as ``policy`` allows.

    ``LLMError``s raised by ``attempt`` itself (e.g. a malformed response) are final. Exceptions the
    classifier doesn't recognise are bugs and propagate unchanged.
    """
    number = 0
    while True:
        number += 1
        try:
            async with asyncio.timeout(policy.timeout):
                return await attempt()
        except LLMError as exc:
            redactor.scrub(exc)
            raise
        except TimeoutError as exc:
            failure = classify(exc) or _timeout_failure(model, policy, exc)
        except Exception as exc:
            classified = classify(exc)
            if classified is None:
                raise
            failure = classified
        if not failure.retryable or number > policy.max_retries:
            raise _final_error(failure, number, redactor) from failure.cause
        await policy.sleep(policy.delay(number - 1, failure.retry_after))


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

