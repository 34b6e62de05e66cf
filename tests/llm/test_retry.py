"""The shared retry loop, Retry-After parsing, backoff and redaction, without any SDK."""

from __future__ import annotations

import asyncio
import traceback
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from debatebus._redaction import redact
from debatebus.exceptions import LLMError, LLMRateLimitError, LLMResponseError, LLMTimeoutError
from debatebus.llm._retry import (
    ProviderFailure,
    Redactor,
    RetryPolicy,
    call_with_retries,
    failure_for_status,
    parse_retry_after,
)
from tests.support.llm import Sleeps


class Flaky(Exception):
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"status {status}")
        self.status = status
        self.headers = headers or {}


def classify(exc: BaseException) -> ProviderFailure | None:
    if isinstance(exc, Flaky):
        return failure_for_status("m", exc.status, str(exc), exc, exc.headers)
    return None


def failing(*errors: BaseException, result: str = "done") -> tuple[list[int], object]:
    calls: list[int] = []

    async def attempt() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return result

    return calls, attempt


def policy(sleeps: Sleeps, **kwargs: object) -> RetryPolicy:
    return RetryPolicy(sleep=sleeps, jitter=lambda: 1.0, **kwargs)  # type: ignore[arg-type]


# --- Retry-After and backoff -------------------------------------------------------------------


def test_retry_after_seconds_milliseconds_and_http_date() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    date = format_datetime(now + timedelta(seconds=7), usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=now) == 7.0
    past = format_datetime(now - timedelta(seconds=30), usegmt=True)
    assert parse_retry_after({"retry-after": past}, now=now) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None
    assert parse_retry_after(None) is None


def test_backoff_is_exponential_capped_and_fully_jittered() -> None:
    top = RetryPolicy(base_delay=0.5, max_delay=3.0, jitter=lambda: 1.0)
    assert [top.delay(i, None) for i in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    bottom = RetryPolicy(base_delay=0.5, max_delay=3.0, jitter=lambda: 0.0)
    assert bottom.delay(3, None) == 0.0


def test_retry_after_wins_over_backoff() -> None:
    p = RetryPolicy(base_delay=0.5, jitter=lambda: 1.0)
    assert p.delay(0, 7.0) == 7.0
    assert p.delay(0, 0.0) == 0.0
    assert p.delay(0, None) == 0.5


# --- the loop ----------------------------------------------------------------------------------


async def test_transient_failures_are_retried_until_success() -> None:
    sleeps = Sleeps()
    calls, attempt = failing(Flaky(500), Flaky(503), Flaky(429))
    result = await call_with_retries(
        attempt,
        model="m",
        policy=policy(sleeps, max_retries=3),
        classify=classify,
        redactor=Redactor(),
    )
    assert result == "done"
    assert len(calls) == 4
    assert sleeps.delays == [0.5, 1.0, 2.0]


async def test_retry_after_header_sets_the_delay() -> None:
    sleeps = Sleeps()
    _, attempt = failing(Flaky(429, {"retry-after": "4"}), Flaky(503, {"retry-after": "2"}))
    await call_with_retries(
        attempt, model="m", policy=policy(sleeps), classify=classify, redactor=Redactor()
    )
    assert sleeps.delays == [4.0, 2.0]


async def test_exhausted_rate_limit_raises_the_tree_type_with_the_cause() -> None:
    sleeps = Sleeps()
    errors = [Flaky(429) for _ in range(3)]
    calls, attempt = failing(*errors)
    with pytest.raises(LLMRateLimitError, match="gave up after 3 attempts") as info:
        await call_with_retries(
            attempt,
            model="m",
            policy=policy(sleeps, max_retries=2),
            classify=classify,
            redactor=Redactor(),
        )
    assert info.value.__cause__ is errors[-1]
    assert len(calls) == 3


async def test_client_errors_are_not_retried() -> None:
    sleeps = Sleeps()
    calls, attempt = failing(Flaky(400))
    with pytest.raises(LLMError, match="HTTP 400") as info:
        await call_with_retries(
            attempt, model="m", policy=policy(sleeps), classify=classify, redactor=Redactor()
        )
    assert type(info.value) is LLMError
    assert len(calls) == 1
    assert sleeps.delays == []


async def test_our_own_errors_pass_through_unretried() -> None:
    calls, attempt = failing(LLMResponseError("m: malformed"))
    with pytest.raises(LLMResponseError, match="malformed"):
        await call_with_retries(
            attempt, model="m", policy=policy(Sleeps()), classify=classify, redactor=Redactor()
        )
    assert len(calls) == 1


async def test_unknown_exceptions_are_bugs_and_propagate_unchanged() -> None:
    calls, attempt = failing(KeyError("oops"))
    with pytest.raises(KeyError):
        await call_with_retries(
            attempt, model="m", policy=policy(Sleeps()), classify=classify, redactor=Redactor()
        )
    assert len(calls) == 1


async def test_per_attempt_timeout_fires_and_is_retried() -> None:
    calls: list[int] = []

    async def hang() -> str:
        calls.append(1)
        await asyncio.sleep(60)
        return "never"

    sleeps = Sleeps()
    with pytest.raises(LLMTimeoutError, match=r"no answer within 0\.2s") as info:
        await call_with_retries(
            hang,
            model="m",
            policy=policy(sleeps, timeout=0.2, max_retries=1),
            classify=classify,
            redactor=Redactor(),
        )
    assert isinstance(info.value.__cause__, TimeoutError)
    assert len(calls) == 2


# --- redaction ---------------------------------------------------------------------------------


def test_redact_masks_key_shapes_and_given_secrets() -> None:
    text = (
        "openai sk-proj-abcdefghijklmnop anthropic sk-ant-api03-XYZxyz123456 "
        "header Bearer tok_1234567890 custom my-own-secret-value"
    )
    cleaned = redact(text, ["my-own-secret-value"])
    for secret in ("abcdefghijklmnop", "XYZxyz123456", "tok_1234567890", "my-own-secret-value"):
        assert secret not in cleaned
    assert cleaned.count("[REDACTED]") == 4
    assert redact("no keys here") == "no keys here"


async def test_redactor_cleans_the_whole_exception_chain() -> None:
    key = "sk-test-0123456789abcdef"

    class SDKError(Exception):
        def __init__(self, message: str) -> None:
            super().__init__(message)
            self.message = message
            self.body = {"error": {"message": f"Incorrect API key provided: {key}"}}

    inner = ConnectionError(f"while sending Authorization: Bearer {key}")
    sdk = SDKError(f"Error code: 401 - Incorrect API key provided: {key}")
    sdk.__context__ = inner

    def classify_sdk(exc: BaseException) -> ProviderFailure | None:
        return failure_for_status("m", 401, str(exc), exc) if isinstance(exc, SDKError) else None

    _, attempt = failing(sdk)
    with pytest.raises(LLMError) as info:
        await call_with_retries(
            attempt,
            model="m",
            policy=policy(Sleeps()),
            classify=classify_sdk,
            redactor=Redactor([key]),
        )
    printed = "".join(traceback.format_exception(info.value))
    assert key not in printed
    assert "[REDACTED]" in printed
    assert key not in repr(sdk.body)
    assert "check the API key" in str(info.value)


# --- the cap on one call -------------------------------------------------------------------------


async def test_a_retry_after_beyond_max_retry_after_fails_at_once() -> None:
    sleeps = Sleeps()
    calls, attempt = failing(Flaky(429, {"retry-after": "3600"}))
    with pytest.raises(LLMRateLimitError) as info:
        await call_with_retries(
            attempt, model="m", policy=policy(sleeps, max_retry_after=60.0), classify=classify,
            redactor=Redactor(),
        )
    message = str(info.value)
    assert "provider asked to wait 3600 s, more than the cap 60 s (max_retry_after)" in message
    assert "HTTP 429" in message
    assert len(calls) == 1
    assert sleeps.delays == []


async def test_a_retry_after_beyond_what_remains_of_the_total_fails_at_once() -> None:
    sleeps = Sleeps()
    calls, attempt = failing(Flaky(503, {"retry-after": "30"}))
    with pytest.raises(LLMRateLimitError, match=r"asked to wait 30 s, more than the cap") as info:
        await call_with_retries(
            attempt, model="m", policy=policy(sleeps, total_timeout=10.0), classify=classify,
            redactor=Redactor(),
        )
    assert "what remains of total_timeout=10s" in str(info.value)
    assert isinstance(info.value.__cause__, Flaky)
    assert len(calls) == 1
    assert sleeps.delays == []


async def test_a_hanging_provider_costs_at_most_the_total_timeout() -> None:
    calls: list[int] = []

    async def hang() -> str:
        calls.append(1)
        await asyncio.sleep(60)
        return "never"

    # One full attempt of 0.6 s, then a second cut short to the 0.55 s left of the total. A first
    # attempt timing out up to 0.55 s late still leaves a second one, cut short; as less than
    # 0.6 s is left after the first, there is never a third.
    with pytest.raises(LLMTimeoutError, match=r"no answer within total_timeout=1\.15s") as info:
        await call_with_retries(
            hang, model="m", policy=policy(Sleeps(), timeout=0.6, total_timeout=1.15,
                                           base_delay=0.001, max_retries=50),
            classify=classify, redactor=Redactor(),
        )
    assert "gave up after 2 attempts" in str(info.value)
    assert len(calls) == 2


async def test_backoff_that_would_outlast_the_total_stops_the_retries() -> None:
    sleeps = Sleeps()
    calls, attempt = failing(Flaky(500), Flaky(500))
    with pytest.raises(LLMError, match=r"gave up after 1 attempt; total_timeout=1s reached"):
        await call_with_retries(
            attempt, model="m", policy=policy(sleeps, base_delay=5.0, total_timeout=1.0),
            classify=classify, redactor=Redactor(),
        )
    assert len(calls) == 1
    assert sleeps.delays == []


def test_the_default_policy_bounds_a_call() -> None:
    default = RetryPolicy()
    assert default.total_timeout is not None
    assert default.timeout is not None
    assert default.total_timeout < (default.max_retries + 1) * default.timeout
