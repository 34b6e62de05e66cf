"""Spend limits: money per time window, checked before each call and charged after it; over the
limit a call is not made and its debate fails as retryable (a replay runs it once the window has
passed), unlike a debate's own cost budget."""

from __future__ import annotations

import pytest

from debatebus import Debate, Participant
from debatebus._pricing import Price, Prices
from debatebus._usage import TokenUsage
from debatebus.exceptions import ConfigError, LLMTimeoutError, SpendLimitError
from debatebus.handlers._results import result_fields
from debatebus.llm import LLMRequest, LLMResponse, MemorySpendLimiter, SpendLimit, SpendLimitedLLM
from debatebus.testing import FunctionLLM

PRICES = Prices({"talker": Price(3.0, 0.3, 3.75, 15.0)})
USAGE = TokenUsage.of(1000, 100)  # (1000·3 + 100·15) / 1e6 = 0.0045 a call
CALL_COST = 0.0045


class Clock:
    def __init__(self, now: float = 7200.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def talker() -> FunctionLLM:
    return FunctionLLM(lambda request: LLMResponse("A point.", None, USAGE, "talker"),
                       model="talker")


async def test_a_call_over_the_limit_is_not_made() -> None:
    clock = Clock()
    limiter = MemorySpendLimiter("team", SpendLimit(max_cost=0.01, window_s=3600), clock=clock)
    inner = talker()
    llm = SpendLimitedLLM(inner, limiter, PRICES)
    request = LLMRequest("S.", ())
    for _ in range(3):  # 0, 0.0045, 0.009 spent before each: all under 0.01
        await llm.complete(request)
    assert (await limiter.window()).spent == pytest.approx(3 * CALL_COST)
    clock.now += 1000.0
    with pytest.raises(SpendLimitError, match=r"spend limit 'team' reached: 0\.0135 USD") as info:
        await llm.complete(request)
    assert len(inner.requests) == 3  # the fourth was never sent
    assert info.value.retry_after_s == pytest.approx(2600.0)
    assert "resend the request, or `debatebus replay --failed`, after that" in str(info.value)
    clock.now += 2600.0  # the next window: spent nothing yet
    await llm.complete(request)
    assert (await limiter.window()).spent == pytest.approx(CALL_COST)


async def test_a_failed_call_is_charged_what_it_reports_or_its_estimate() -> None:
    limiter = MemorySpendLimiter("team", SpendLimit(max_cost=1.0), clock=Clock())
    failures = iter([LLMTimeoutError("slow"), LLMTimeoutError("slow", usage=USAGE)])

    def fail(request: LLMRequest) -> None:
        raise next(failures)

    llm = SpendLimitedLLM(FunctionLLM(fail, model="talker"), limiter, PRICES)
    request = LLMRequest("x" * 400, (), max_tokens=200)  # about 100 prompt tokens, 200 answer
    with pytest.raises(LLMTimeoutError):
        await llm.complete(request)
    estimate = (100 * 3.0 + 200 * 15.0) / 1e6
    assert (await limiter.window()).spent == pytest.approx(estimate)
    with pytest.raises(LLMTimeoutError):
        await llm.complete(request)
    assert (await limiter.window()).spent == pytest.approx(estimate + CALL_COST)


def test_a_spend_limit_needs_the_models_price_in_its_currency() -> None:
    limiter = MemorySpendLimiter("team", SpendLimit(max_cost=1.0))
    with pytest.raises(ConfigError, match="needs the price of 'other'"):
        SpendLimitedLLM(FunctionLLM(lambda r: "x", model="other"), limiter, PRICES)
    euros = MemorySpendLimiter("team", SpendLimit(max_cost=1.0, currency="EUR"))
    with pytest.raises(ConfigError, match="is in EUR, prices in USD"):
        SpendLimitedLLM(talker(), euros, PRICES)
    with pytest.raises(ConfigError, match="max_cost must be a positive number"):
        SpendLimit(max_cost=0)


async def test_a_debate_over_the_limit_fails_retryable_with_its_stop_reason() -> None:
    limiter = MemorySpendLimiter("debate:request", SpendLimit(max_cost=0.01), clock=Clock())
    debate = Debate("trio", [Participant(n, f"{n}.") for n in ("ann", "bob", "cyd", "dan")],
                    llm=SpendLimitedLLM(talker(), limiter, PRICES), prices=PRICES)
    result = await debate.run("Tabs?")
    # ann, bob and cyd spoke (0.0135 spent); dan's call found the window's limit reached.
    assert result.status == "failed" and result.rounds == []
    assert result.stop_reason == "spend_limit"
    assert result.retryable  # not final: once the window has passed, it runs again
    assert "spend limit 'debate:request' reached" in (result.error or "")
    fields = result_fields(result)
    assert (fields["debateStopReason"], fields["debateRetryable"]) == ("spend_limit", True)
    assert result.cost is not None and result.cost.total == pytest.approx(3 * CALL_COST)
