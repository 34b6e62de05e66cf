"""What a debate costs: prices, the cost by speaker and of sub-debates, the cost budget, and no
``debateCost`` unless every model used is priced.

The models answer with fixed usage, so each call's cost is computed here by hand: a participant's
call (1000 prompt tokens, 600 of them read from the cache and 200 written, 100 completion) at
3 / 0.3 / 3.75 / 15 per million costs (200·3 + 600·0.3 + 200·3.75 + 100·15) / 1e6 = 0.00303; a
judge's (500 prompt, 50 completion) at 1 / 0.1 / 1.25 / 5 costs (500·1 + 50·5) / 1e6 = 0.00075.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from debatebus import Budget, Debate, Judge, Participant
from debatebus._pricing import DEFAULT_PRICES, Price, Prices
from debatebus._usage import TokenUsage
from debatebus.checkpoints._base import StoredCheckpoint
from debatebus.engine import Verdict
from debatebus.engine._subdebates import SubDebates
from debatebus.exceptions import ConfigError
from debatebus.handlers._checkpointing import (
    committed_items,
    counters_of,
    encode_entry,
    restore_progress,
)
from debatebus.handlers._results import result_fields
from debatebus.llm import LLMRequest, LLMResponse
from debatebus.schemas import events as ev
from debatebus.testing import FunctionLLM

TURN_USAGE = TokenUsage.of(1000, 100, cache_read_tokens=600, cache_write_tokens=200)
TURN_COST = 0.00303
JUDGE_USAGE = TokenUsage.of(500, 50)
JUDGE_COST = 0.00075
PRICES = Prices({"talker": Price(3.0, 0.3, 3.75, 15.0), "judger": Price(1.0, 0.1, 1.25, 5.0)},
                as_of="2030-01-01")
VERDICT = Verdict(consensus=False, summary="apart")


def talker(text: str = "A point.") -> FunctionLLM:
    return FunctionLLM(lambda request: LLMResponse(text, None, TURN_USAGE, "talker"),
                       model="talker")


def judger() -> FunctionLLM:
    return FunctionLLM(lambda request: LLMResponse(VERDICT.model_dump_json(), VERDICT,
                                                   JUDGE_USAGE, "judger"), model="judger")


def duo(**options: Any) -> Debate:
    options.setdefault("llm", talker())
    return Debate("duo", [Participant("ann", "A."), Participant("bob", "B.")],
                  judge=Judge(llm=judger()), max_rounds=2, **options)


# ---- prices -------------------------------------------------------------------------------------


def test_a_price_bills_uncached_read_written_and_output_tokens_apart() -> None:
    price = Price(input=3.0, cached_input=0.3, cache_write=3.75, output=15.0)
    assert price.cost(TURN_USAGE) == pytest.approx(TURN_COST, abs=1e-12)
    assert price.cost(TokenUsage.of(1_000_000, 0)) == 3.0
    assert PRICES.cost("unknown", TURN_USAGE) is None  # never an estimate


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_prices_load_from_a_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"prices{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps({"currency": "EUR", "as_of": "2030-02-01", "models": {
            "m": {"input": 2, "cached_input": 0.2, "cache_write": 2.5, "output": 8}}}))
    else:
        path.write_text('currency = "EUR"\nas_of = 2030-02-01\n[models."m"]\ninput = 2\n'
                        "cached_input = 0.2\ncache_write = 2.5\noutput = 8\n")
    prices = Prices.from_file(path)
    assert (prices.currency, prices.as_of) == ("EUR", "2030-02-01")
    assert prices.price_of("m") == Price(2, 0.2, 2.5, 8)


def test_bad_price_files_say_what_to_fix(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"models": {"m": {"input": 1, "output": 2}}}')
    with pytest.raises(ConfigError, match=r"needs exactly \['input', 'cached_input'"):
        Prices.from_file(path)
    path.write_text('{"models": {"m": {"input": -1, "cached_input": 0, "cache_write": 0, '
                    '"output": 0}}}')
    with pytest.raises(ConfigError, match="input must be a number ≥ 0"):
        Prices.from_file(path)
    with pytest.raises(ConfigError, match="cannot read prices"):
        Prices.from_file(tmp_path / "missing.toml")


def test_defaults_are_dated_and_overridable() -> None:
    assert DEFAULT_PRICES.as_of and DEFAULT_PRICES.currency == "USD"
    mine = DEFAULT_PRICES.updated({"gpt-4o-mini": Price(1, 1, 1, 1), "mine": Price(2, 2, 2, 2)})
    assert mine.price_of("gpt-4o-mini") == Price(1, 1, 1, 1)
    assert mine.price_of("claude-sonnet-4-5") == DEFAULT_PRICES.price_of("claude-sonnet-4-5")
    assert DEFAULT_PRICES.price_of("mine") is None  # the defaults themselves are unchanged
    with pytest.raises(ConfigError, match="one currency"):
        DEFAULT_PRICES.updated(Prices({"m": Price(1, 1, 1, 1)}, currency="EUR"))


# ---- what a debate cost -------------------------------------------------------------------------


async def test_the_cost_by_speaker_is_each_call_at_its_models_price() -> None:
    result = await duo(prices=PRICES).run("Tabs?")
    assert result.ok
    cost = result.cost
    assert cost is not None
    # 2 rounds: ann and bob speak twice each, the judge rules twice.
    assert cost.participants == pytest.approx(
        {"ann": 2 * TURN_COST, "bob": 2 * TURN_COST, "judge": 2 * JUDGE_COST}, abs=1e-12)
    assert cost.total == pytest.approx(4 * TURN_COST + 2 * JUDGE_COST, abs=1e-12)
    assert (cost.currency, cost.prices_as_of, cost.children) == ("USD", "2030-01-01", 0.0)
    assert result_fields(result)["debateCost"] == {
        "currency": "USD", "total": cost.total, "participants": cost.participants,
        "children": 0.0, "pricesAsOf": "2030-01-01"}
    # The usage counts the cached tokens too, by turn, round and debate.
    assert result.rounds[0].turns[0].usage == TURN_USAGE
    assert result.rounds[0].usage == TURN_USAGE + TURN_USAGE + JUDGE_USAGE
    assert result.token_usage.cache_read_tokens == 4 * 600
    assert result_fields(result)["debateTokenUsage"]["cacheWriteTokens"] == 4 * 200


async def test_a_result_without_prices_has_no_cost_key() -> None:
    unpriced = await duo().run("Tabs?")
    assert unpriced.cost is None
    assert "debateCost" not in result_fields(unpriced)
    # Prices that miss one model used (the judge's): no cost either, never a partial one.
    partial = await duo(prices=Prices({"talker": PRICES.models["talker"]})).run("Tabs?")
    assert partial.ok and partial.cost is None
    assert "debateCost" not in result_fields(partial)


async def test_sub_debates_cost_is_included() -> None:
    """A position that asks a specialist panel: the child's calls are priced too, and count in
    the parent's total (its participants' costs stay its own)."""

    def answer(request: LLMRequest) -> LLMResponse:
        asks = (request.purpose == "revision" and request.speaker == "ann"
                and "~sub-" not in request.cache_key and "concluded" not in request.prompt)
        text = "I need specialists.\nREQUEST_SUB_DEBATE: security" if asks else "A point."
        return LLMResponse(text, None, TURN_USAGE, "talker")

    llm = FunctionLLM(answer, model="talker")
    panel = [Participant("sec1", "S1."), Participant("sec2", "S2.")]
    debate = Debate("parent", [Participant("ann", "A."), Participant("bob", "B.")], llm=llm,
                    protocol="cross-pollination", prices=PRICES,
                    sub_debates=SubDebates({"security": panel}))
    result = await debate.run("Ship it?", debate_id="p")
    assert result.ok
    [child] = result.sub_debates
    assert child.status == "completed"
    child_calls = sum(1 for r in llm.requests if r.cache_key == child.child_id)
    own_calls = sum(1 for r in llm.requests if r.cache_key == "p")
    assert child_calls >= 5 and own_calls + child_calls == len(llm.requests)
    cost = result.cost
    assert cost is not None and child.cost is not None
    assert child.cost.total == pytest.approx(child_calls * TURN_COST, abs=1e-12)
    assert cost.children == pytest.approx(child_calls * TURN_COST, abs=1e-12)
    assert sum(cost.participants.values()) == pytest.approx(own_calls * TURN_COST, abs=1e-12)
    assert cost.total == pytest.approx(len(llm.requests) * TURN_COST, abs=1e-12)
    assert result.total_usage.cache_read_tokens == len(llm.requests) * 600


async def test_a_child_on_an_unpriced_model_leaves_the_parent_without_a_cost() -> None:
    def answer(request: LLMRequest) -> LLMResponse:
        asks = request.purpose == "revision" and request.speaker == "ann" and (
            "concluded" not in request.prompt)
        text = "REQUEST_SUB_DEBATE: security" if asks else "A point."
        return LLMResponse(text, None, TURN_USAGE, "talker")

    other = FunctionLLM(lambda request: LLMResponse("ok", None, TURN_USAGE, "other"),
                        model="other")
    child = Debate("security", [Participant("s1", "S."), Participant("s2", "T.")], llm=other,
                   protocol="cross-pollination", prices=PRICES)
    debate = Debate("parent", [Participant("ann", "A."), Participant("bob", "B.")],
                    llm=FunctionLLM(answer, model="talker"), protocol="cross-pollination",
                    prices=PRICES, sub_debates=SubDebates({"security": child}))
    result = await debate.run("Ship it?")
    assert result.ok and result.sub_debates[0].status == "completed"
    assert result.sub_debates[0].cost is None
    assert result.cost is None


async def test_the_cost_survives_a_resume() -> None:
    """What each speaker spent is read back from the committed rounds: a debate resumed after
    round 1 costs what it would have cost in one run."""
    whole = await duo(prices=PRICES).run("Tabs?")
    snapshots = []

    async def commit(progress: Any, item: Any) -> None:
        snapshots.append((committed_items(progress), counters_of(progress)))

    calls = 0

    def failing_judge(request: LLMRequest) -> LLMResponse:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RuntimeError("judge down")
        return LLMResponse(VERDICT.model_dump_json(), VERDICT, JUDGE_USAGE, "judger")

    broken = Debate("duo", [Participant("ann", "A."), Participant("bob", "B.")], llm=talker(),
                    judge=Judge(llm=FunctionLLM(failing_judge, model="judger")), max_rounds=2,
                    prices=PRICES)
    failed = await broken.run("Tabs?", on_commit=commit)
    assert not failed.ok and len(failed.rounds) == 1
    items, counters = snapshots[-1]
    stored = StoredCheckpoint(b"{}", [encode_entry(i) for i in items], counters)
    progress = restore_progress(stored, broken.spec)
    assert progress.by_speaker == {"ann": TURN_USAGE, "bob": TURN_USAGE, "judge": JUDGE_USAGE}
    assert progress.usage.cache_read_tokens == 2 * 600
    resumed = await duo(prices=PRICES).run("Tabs?", resume=progress)
    assert resumed.ok and resumed.resumed_from_round == 1
    assert resumed.cost == whole.cost
    assert resumed.token_usage == whole.token_usage


# ---- the cost budget ----------------------------------------------------------------------------


async def test_max_cost_stops_a_debate_mid_round_with_its_stop_reason() -> None:
    events: list[ev.DebateEvent] = []
    debate = Debate("trio", [Participant(n, f"{n}.") for n in ("ann", "bob", "cyd")],
                    llm=talker(), judge=Judge(llm=judger()), prices=PRICES,
                    budget=Budget(max_cost=0.005))
    result = await debate.run("Tabs?", on_event=events.append)
    # ann (0.00303) and bob (0.00606 in all) spoke; cyd's call would go past the budget.
    assert result.status == "failed" and result.rounds == []
    assert [e.speaker for e in events if isinstance(e, ev.TurnCompleted)] == ["ann", "bob"]
    assert result.stop_reason == "max_cost" and not result.retryable  # final: same budget again
    assert "max_cost=0.005 reached" in (result.error or "")
    assert result.cost is not None and result.cost.total == pytest.approx(2 * TURN_COST)
    fields = result_fields(result)
    assert (fields["debateStopReason"], fields["debateRetryable"]) == ("max_cost", False)
    [failed] = [e for e in events if isinstance(e, ev.DebateFailed)]
    assert failed.stop_reason == "max_cost" and failed.cost == result.cost


async def test_other_budget_limits_say_which_stopped_the_debate() -> None:
    result = await duo(budget=Budget(max_calls=3)).run("Tabs?")
    assert result.stop_reason == "max_calls"
    result = await duo(budget=Budget(max_total_tokens=1500)).run("Tabs?")
    assert result.stop_reason == "max_total_tokens"
    assert "debateStopReason" not in result_fields(await duo().run("Tabs?"))


def test_max_cost_needs_a_price_for_every_model() -> None:
    with pytest.raises(ConfigError, match=r"needs prices: pass prices="):
        duo(budget=Budget(max_cost=1.0))
    with pytest.raises(ConfigError, match=r"prices has none for \['judger'\]"):
        duo(budget=Budget(max_cost=1.0), prices=Prices({"talker": Price(1, 1, 1, 1)}))
    with pytest.raises(ConfigError, match="max_cost must be a positive amount"):
        Budget(max_cost=0)
