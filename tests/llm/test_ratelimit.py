"""Rate limiters: one contract run against the memory and the Redis limiter, the LLM wrapper, and a
provider's 429 (Retry-After, x-ratelimit-* headers) reaching the shared bucket."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from debatebus._usage import TokenUsage
from debatebus.exceptions import ConfigError, LLMError, TransportError
from debatebus.llm import FunctionLLM, LLMRequest, LLMResponse, Message
from debatebus.llm._openai_compat import OpenAICompatibleLLM
from debatebus.llm._rate_limits import with_rate_limits
from debatebus.llm._ratelimit import (
    MemoryRateLimiter,
    Permit,
    RateLimit,
    RateLimitedLLM,
    RateLimiter,
    estimate_tokens,
    parse_rate_limits,
)
from debatebus.llm._ratelimit_redis import RedisRateLimiter
from debatebus.llm._retry import RetryPolicy, parse_rate_limit_reset
from debatebus.observability._metrics import PrometheusObserver
from tests.llm.servers import FakeAPI, Reply
from tests.support.llm import Sleeps, granted_now, granted_within
from tests.support.servers import free_port

Factory = Callable[..., RateLimiter]
REQUEST = LLMRequest("sys", (Message("user", "x" * 40),), max_tokens=100)  # estimate 11 + 100


@pytest.fixture(params=["memory", "redis"])
async def make(request: pytest.FixtureRequest) -> AsyncIterator[Factory]:
    """Builds limiters of one kind; Redis ones share a bucket when given the same name."""
    made: list[RateLimiter] = []
    url = request.getfixturevalue("redis_server").url if request.param == "redis" else None

    def factory(limit: RateLimit, name: str = "", **kwargs: Any) -> RateLimiter:
        name = name or f"model-{uuid.uuid4().hex[:8]}"
        limiter: RateLimiter = (MemoryRateLimiter(name, limit, **kwargs) if url is None
                                else RedisRateLimiter(url, name, limit, **kwargs))
        made.append(limiter)
        return limiter

    yield factory
    for limiter in made:
        await limiter.close()


async def timed(coro: Any) -> float:
    started = time.monotonic()
    await coro
    return time.monotonic() - started


async def warm(limiter: RateLimiter) -> RateLimiter:
    """Connects a Redis limiter and loads its script, so that timings measure waits for budget,
    not a first connection: ``penalize(0)`` takes nothing and pauses nobody."""
    await limiter.penalize(0)
    return limiter


def refusals(limiter: RateLimiter) -> asyncio.Event:
    """An event set once one of the limiter's non-blocking attempts (its subclass hook
    ``_try_acquire``) has answered "wait": the positive sign that an ask was made and refused."""
    refused = asyncio.Event()
    attempt = limiter._try_acquire

    async def counted(permit: Permit, requests: int) -> float:
        wait = await attempt(permit, requests)
        if wait > 0:
            refused.set()
        return wait

    limiter._try_acquire = counted  # type: ignore[method-assign]
    return refused


async def still_waiting(limiter: RateLimiter, **kwargs: int) -> bool:
    """Whether ``acquire`` has not succeeded after 0.2 s (it is cancelled then, taking nothing).
    Every case asked needs 5 s and more, so a slow machine cannot make it succeed in time."""
    return not await granted_within(limiter, 0.2, **kwargs)


# --- RateLimit ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    {}, {"requests_per_minute": 0}, {"tokens_per_minute": -5}, {"requests_per_minute": float("nan")},
    {"max_concurrent": 0}, {"max_concurrent": 1.5}, {"max_concurrent": True},
    {"requests_per_minute": 10, "burst": 0}, {"requests_per_minute": 10, "burst": 1.5},
    {"requests_per_minute": 10, "period_s": 0},
])
def test_rate_limit_rejects_what_cannot_be_a_limit(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="RateLimit"):
        RateLimit(**kwargs)


def test_rate_limit_is_frozen_and_gives_rates_and_capacities() -> None:
    limit = RateLimit(requests_per_minute=120, tokens_per_minute=6000, burst=0.5, period_s=3)
    assert limit.rate(limit.requests_per_minute) == 40.0
    assert limit.capacity(limit.tokens_per_minute) == 3000.0
    assert limit.rate(None) == limit.capacity(None) == 0.0
    with pytest.raises(AttributeError):
        limit.burst = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("name", ["", "a{b", "x}"])
def test_limit_names_must_be_usable_as_a_hash_tag(name: str) -> None:
    with pytest.raises(ConfigError, match="name"):
        MemoryRateLimiter(name, RateLimit(requests_per_minute=1))


# --- the contract, on both limiters -------------------------------------------------------------


async def test_requests_are_granted_up_to_the_bucket_then_at_the_refill_rate(make: Factory) -> None:
    limiter = await warm(make(RateLimit(requests_per_minute=10, period_s=6.0)))  # 10, then 5 per 3 s
    started = time.monotonic()
    # 10 at once: 10 round trips, where refilling them one by one would take 5.4 s.
    assert await timed(asyncio.gather(*(limiter.acquire() for _ in range(10)))) < 3.0
    await asyncio.gather(*(limiter.acquire() for _ in range(5)))
    # 5 more at 5 per 3 s: 10 + 5/3 × (seconds since the start) grants at most, on any machine;
    # a limiter that waited for a whole bucket would take 6 s.
    assert 2.95 <= time.monotonic() - started < 5.5


async def test_tokens_wait_for_the_bucket_and_settle_corrects_the_estimate(make: Factory) -> None:
    limiter = make(RateLimit(tokens_per_minute=1000, period_s=60.0))  # refills 16.7 tokens/s
    permit = await limiter.acquire(tokens=900)
    assert await still_waiting(limiter, tokens=500)
    await limiter.settle(permit, 300)  # 600 come back: ~700 now
    assert await granted_now(limiter, tokens=690)
    assert await still_waiting(limiter, tokens=100)


async def test_settle_can_leave_the_bucket_in_debt(make: Factory) -> None:
    limiter = await warm(make(RateLimit(tokens_per_minute=600, period_s=6.0)))  # 100 tokens/s
    started = time.monotonic()
    permit = await limiter.acquire(tokens=100)
    await limiter.settle(permit, 700)  # 600 more than estimated: the bucket is at -100
    await limiter.settle(permit, 5000)  # a permit settles once
    await limiter.acquire(tokens=50)
    # From -100 to 50 at 100/s: 1.5 s after the first acquire at least, however slow the steps
    # in between (a full bucket of 600 again would take 7 s).
    assert 1.45 <= time.monotonic() - started < 5.0


async def test_a_call_larger_than_the_bucket_waits_for_a_full_bucket(make: Factory) -> None:
    limiter = make(RateLimit(tokens_per_minute=200, period_s=1.0))
    assert await granted_now(limiter, tokens=5000)  # full: granted, the bucket goes into debt
    assert await still_waiting(limiter, tokens=1)


async def test_penalize_pauses_every_caller(make: Factory) -> None:
    limiter = await warm(make(RateLimit(requests_per_minute=1000)))
    started = time.monotonic()

    async def granted_at() -> float:
        await limiter.acquire()
        return time.monotonic() - started

    await limiter.penalize(0.5)
    await limiter.penalize(0.1)  # a shorter pause does not cut the longer one
    waits = await asyncio.gather(*(granted_at() for _ in range(3)))
    assert all(0.45 <= wait < 3.0 for wait in waits), waits  # 0.5 s from before penalize()


async def test_max_concurrent_holds_until_release(make: Factory) -> None:
    limiter = make(RateLimit(max_concurrent=2))
    first, _second = await limiter.acquire(), await limiter.acquire()
    refused = refusals(limiter)
    third = asyncio.create_task(limiter.acquire())
    # The limiter has answered the third's ask with "wait" (not merely not got to it yet).
    await asyncio.wait_for(refused.wait(), 5.0)
    assert not third.done()
    await limiter.release(first)
    await limiter.release(first)  # a permit releases once
    await asyncio.wait_for(third, 5.0)
    assert await still_waiting(limiter)


async def test_a_cancelled_wait_takes_nothing(make: Factory) -> None:
    limiter = make(RateLimit(max_concurrent=1))
    held = await limiter.acquire()
    assert await still_waiting(limiter)  # wait_for cancelled it mid-wait
    await limiter.release(held)
    assert await granted_now(limiter)


async def test_every_grant_reports_its_wait(make: Factory) -> None:
    waits: list[tuple[str, float]] = []
    limiter = make(RateLimit(requests_per_minute=60, period_s=0.5), name="reported",
                   on_wait=lambda name, seconds: waits.append((name, seconds)))
    await warm(limiter)
    first_took = await timed(limiter.acquire())
    permits = [await limiter.acquire() for _ in range(60)]
    assert [name for name, _ in waits] == ["reported"] * 61
    assert 0.0 <= waits[0][1] <= first_took  # the acquire's own wait, in seconds
    assert waits[-1][1] > 0.0
    assert permits[-1].waited_s == waits[-1][1]


# --- Redis only ------------------------------------------------------------------------------


async def test_redis_limiters_with_one_name_share_one_bucket(redis_server: Any) -> None:
    name = f"shared-{uuid.uuid4().hex[:8]}"
    limit = RateLimit(requests_per_minute=4, max_concurrent=3, period_s=60.0)
    one, two = (RedisRateLimiter(redis_server.url, name, limit) for _ in range(2))
    other = RedisRateLimiter(redis_server.url, f"other-{name}", limit)
    try:
        held = [await one.acquire(), await two.acquire(), await one.acquire()]
        assert await still_waiting(two)  # 3 slots held across both clients
        await one.release(held[0])
        assert await granted_now(two)  # the 4th request of 4
        assert await granted_now(other)  # another name: its own bucket
        await one.release(held[1])
        assert await still_waiting(two)  # a slot is free, but the minute's 4 requests are gone
        await two.penalize(30)
        keys = sorted(k.decode() for k in redis_server.client().keys(f"*:{{ratelimit:{name}}}:*"))
        assert keys == [f"debatebus:{{ratelimit:{name}}}:bucket",
                        f"debatebus:{{ratelimit:{name}}}:holders"]
        ttl = redis_server.client().pttl(keys[0])
        assert 30_000 <= ttl <= 61_000 + 1000  # refills in ≤ 60 s: then a missing key means full
    finally:
        for limiter in (one, two, other):
            await limiter.close()


async def test_a_burst_of_calls_ending_at_once_settles_and_frees_every_slot(
        redis_server: Any) -> None:
    """300 calls ending in one tick (a provider answering a batch at once) settle their tokens
    and free their slots together: pipelined over one connection. (A connection each ran
    redis-py's pool of 100 dry: the settles failed, and the slots stayed held until their
    lease ran out, minutes later.) Then the next 300 are granted at once."""
    limiter = RedisRateLimiter(redis_server.url, f"burst-{uuid.uuid4().hex[:8]}",
                               RateLimit(tokens_per_minute=10_000_000, max_concurrent=300))
    try:
        permits = [await limiter.acquire(tokens=10) for _ in range(300)]
        assert await still_waiting(limiter)  # every slot is held
        await asyncio.gather(*(limiter.settle(p, 20) for p in permits))
        await asyncio.gather(*(limiter.release(p) for p in permits))
        assert await granted_now(limiter)
        await asyncio.wait_for(asyncio.gather(*(limiter.acquire() for _ in range(299))), 10)
    finally:
        await limiter.close()


async def test_redis_forgetting_the_script_is_survived(redis_server: Any) -> None:
    limiter = RedisRateLimiter(redis_server.url, f"flush-{uuid.uuid4().hex[:8]}",
                               RateLimit(requests_per_minute=600))
    try:
        await limiter.acquire()
        redis_server.client().script_flush()  # what a restarted Redis has forgotten
        await asyncio.gather(*(limiter.acquire() for _ in range(50)))
    finally:
        await limiter.close()


async def test_an_unreachable_redis_raises_transport_error() -> None:
    limiter = RedisRateLimiter(f"redis://127.0.0.1:{free_port()}/0", "m",
                               RateLimit(requests_per_minute=1), connect_timeout=0.5)
    with pytest.raises(TransportError, match="cannot reach Redis"):
        await limiter.acquire()
    await limiter.close()


# --- the LLM wrapper -----------------------------------------------------------------------------


class FrozenClock:
    """No refill: what the bucket holds changes only by what the test takes and gives back."""

    def __call__(self) -> float:
        return 0.0


def test_estimate_is_prompt_characters_over_four_plus_the_answer_cap() -> None:
    assert estimate_tokens(REQUEST, default_max_tokens=7) == 11 + 100
    no_cap = LLMRequest("", (Message("user", "abcd" * 10),))
    assert estimate_tokens(no_cap, default_max_tokens=7) == 10 + 7


async def test_rate_limited_llm_charges_what_the_response_used() -> None:
    limiter = MemoryRateLimiter("m", RateLimit(tokens_per_minute=1000), clock=FrozenClock())
    inner = FunctionLLM(lambda request: LLMResponse("hi", usage=TokenUsage(15, 5, 20)))
    llm = RateLimitedLLM(inner, limiter)
    assert llm.model == inner.model
    assert (await llm.complete(REQUEST)).text == "hi"
    assert await granted_now(limiter, tokens=980)  # 1000 - 20 actually used
    assert await still_waiting(limiter, tokens=1)


async def test_a_failed_call_keeps_its_estimate_charged_and_frees_its_slot() -> None:
    limiter = MemoryRateLimiter("m", RateLimit(tokens_per_minute=1000, max_concurrent=1),
                                clock=FrozenClock())
    llm = RateLimitedLLM(FunctionLLM(lambda request: LLMError("down")), limiter)
    with pytest.raises(LLMError, match="down"):
        await llm.complete(REQUEST)
    assert await granted_now(limiter, tokens=1000 - 111)  # the estimate stays taken
    assert await still_waiting(limiter, tokens=1)


async def test_a_cancelled_call_frees_its_slot() -> None:
    limiter = MemoryRateLimiter("m", RateLimit(max_concurrent=1))
    llm = RateLimitedLLM(FunctionLLM(lambda request: asyncio.sleep(60)), limiter)
    call = asyncio.create_task(llm.complete(REQUEST))
    await asyncio.sleep(0.05)
    assert await still_waiting(limiter)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await granted_now(limiter)


async def test_a_broker_failure_after_the_call_keeps_its_answer(
        caplog: pytest.LogCaptureFixture) -> None:
    class BrokenAfterwards(MemoryRateLimiter):
        async def _release(self, permit: Any) -> None:
            raise TransportError("cannot reach Redis at 127.0.0.1:1")

    llm = RateLimitedLLM(FunctionLLM(lambda request: "answer"),
                         BrokenAfterwards("m", RateLimit(max_concurrent=1)))
    assert (await llm.complete(REQUEST)).text == "answer"
    assert "could not settle a call: cannot reach Redis" in caplog.text


async def test_retry_after_from_the_provider_pauses_the_fleet(
        fake_api: FakeAPI, redis_server: Any) -> None:
    name = f"gpt-{uuid.uuid4().hex[:8]}"
    limit = RateLimit(requests_per_minute=1000)
    mine, theirs = (RedisRateLimiter(redis_server.url, name, limit) for _ in range(2))
    fake_api.plan(Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "1"}))
    sleeps = Sleeps()
    provider = OpenAICompatibleLLM("fake-model", base_url=f"{fake_api.url}/v1",
                                   retry_policy=RetryPolicy(sleep=sleeps))
    try:
        await warm(mine)
        await warm(theirs)
        started = time.monotonic()
        assert (await RateLimitedLLM(provider, mine).complete(REQUEST)).text == "ok"
        assert sleeps.delays == [1.0]  # the provider's own retry waited as asked
        await theirs.acquire()  # another worker's limiter waits too: 1 s from the 429 on
        assert 0.95 <= time.monotonic() - started < 5.0
    finally:
        await mine.close()
        await theirs.close()


async def test_exhausted_ratelimit_headers_pause_when_there_is_no_retry_after(
        fake_api: FakeAPI) -> None:
    pauses: list[float] = []

    class Spy(MemoryRateLimiter):
        async def penalize(self, seconds: float) -> None:
            pauses.append(seconds)
            await super().penalize(seconds)

    fake_api.plan(Reply(429, {"error": {"message": "tokens"}}, headers={
        "x-ratelimit-remaining-requests": "12", "x-ratelimit-reset-requests": "9s",
        "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1m2.5s"}))
    provider = OpenAICompatibleLLM("fake-model", base_url=f"{fake_api.url}/v1",
                                   retry_policy=RetryPolicy(sleep=Sleeps()))
    llm = RateLimitedLLM(provider, Spy("m", RateLimit(requests_per_minute=100)))
    await llm.complete(REQUEST)
    assert pauses == [62.5]  # only the exhausted limit counts


# --- configuration -------------------------------------------------------------------------------


def test_parse_rate_limits_reads_the_env_form() -> None:
    limits = parse_rate_limits(" gpt-4o-mini=rpm:500,tpm:200000,concurrent:20; *=rpm:60,period:30 ")
    assert limits == {
        "gpt-4o-mini": RateLimit(requests_per_minute=500, tokens_per_minute=200000,
                                 max_concurrent=20),
        "*": RateLimit(requests_per_minute=60, period_s=30.0),
    }
    for bad, why in [("m=rpm:x", "needs a number"), ("m=qps:3", "unknown key"),
                     ("rpm:3", "MODEL="), ("m=", "RateLimit needs")]:
        with pytest.raises(ConfigError, match=why):
            parse_rate_limits(bad)


def test_with_rate_limits_wraps_only_models_with_a_limit(
        monkeypatch: pytest.MonkeyPatch, redis_server: Any) -> None:
    plain = FunctionLLM(lambda request: "x", model="free-model")
    assert with_rate_limits(plain, "other=rpm:5") is plain
    monkeypatch.setenv("DEBATEBUS_RATE_LIMITS", "free-model=rpm:5")
    wrapped = with_rate_limits(plain)
    assert isinstance(wrapped, RateLimitedLLM)
    assert isinstance(wrapped.limiter, MemoryRateLimiter)
    assert wrapped.limiter.name == "free-model"
    shared = with_rate_limits(plain, "*=tpm:100", redis_url=redis_server.url)
    assert isinstance(shared, RateLimitedLLM)
    assert isinstance(shared.limiter, RedisRateLimiter)
    assert shared.limiter.limit == RateLimit(tokens_per_minute=100)


def test_anthropic_and_bare_number_resets_are_read() -> None:
    now = datetime(2026, 12, 1, 18, 0, 0, tzinfo=UTC)
    assert parse_rate_limit_reset({
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2026-12-01T18:00:30Z",
        "anthropic-ratelimit-tokens-remaining": "4000",
        "anthropic-ratelimit-tokens-reset": "2026-12-01T18:00:50Z"}, now=now) == 30.0
    assert parse_rate_limit_reset({"x-ratelimit-remaining-requests": "0",
                                   "x-ratelimit-reset-requests": "2"}) == 2.0
    assert parse_rate_limit_reset({"x-ratelimit-remaining-requests": "0",
                                   "x-ratelimit-reset-requests": "soon"}) is None


async def test_waits_feed_the_prometheus_histogram() -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry=registry)
    llm = with_rate_limits(FunctionLLM(lambda request: "x", model="m"), "m=rpm:60,period:0.5",
                           on_wait=observer.ratelimit_waited)
    for _ in range(3):
        await llm.complete(REQUEST)
    count = registry.get_sample_value("debatebus_ratelimit_wait_seconds_count", {"limit": "m"})
    assert count == 3
