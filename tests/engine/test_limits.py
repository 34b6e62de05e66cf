"""Budgets and deadlines end a debate as failed, naming the limit and keeping what was done."""

from __future__ import annotations

import time

from debatebus import Budget, Debate, Judge, Participant
from debatebus.llm import TokenUsage
from debatebus.llm._fakes import word_usage

TOPIC = "Should we rewrite it in Rust?"
NAMES = ("alice", "bob", "carol")


def people(names=NAMES) -> list[Participant]:
    return [Participant(n, f"You are {n}.") for n in names]


def judged(stage, **options) -> Debate:
    return Debate("rust", people(), llm=stage.llm, judge=Judge(), max_rounds=3, **options)


async def test_max_calls_ends_the_debate_as_failed_naming_the_budget(make_stage):
    stage = make_stage()
    result = await judged(stage, budget=Budget(max_calls=5)).run(TOPIC)

    assert result.status == "failed"
    assert result.error == (
        "budget max_calls=5 reached: 5 calls made before rebuttal by 'bob' in round 2"
    )
    assert result.calls == 5
    assert len(stage.requests) == 5
    assert [r.number for r in result.rounds] == [1]  # the partial transcript is kept
    assert result.token_usage == stage.expected_usage()


async def test_max_calls_refusing_a_judge_call(make_stage):
    stage = make_stage()
    result = await judged(stage, budget=Budget(max_calls=3)).run(TOPIC)
    assert result.status == "failed"
    assert "judge by 'judge' failed in round 1" in result.error
    assert "BudgetExceededError: budget max_calls=3 reached" in result.error
    assert result.calls == 3


async def test_a_budget_that_is_exactly_enough_completes(make_stage):
    stage = make_stage()
    result = await judged(stage, budget=Budget(max_calls=12)).run(TOPIC)  # 3 × (3 turns + verdict)
    assert result.status == "completed"
    assert result.calls == 12


async def test_max_total_tokens_ends_the_debate_as_failed(make_stage):
    first_round = (await judged(make_stage()).run(TOPIC)).rounds[0].usage.total_tokens
    stage = make_stage()
    result = await judged(stage, budget=Budget(max_total_tokens=first_round)).run(TOPIC)

    assert result.status == "failed"
    assert result.error == (
        f"budget max_total_tokens={first_round} reached: {first_round} tokens spent before "
        "rebuttal by 'alice' in round 2"
    )
    assert [r.number for r in result.rounds] == [1]
    assert result.token_usage.total_tokens == first_round
    assert result.token_usage == stage.expected_usage()


async def test_budget_in_cross_pollination(make_stage):
    stage = make_stage()
    d = Debate(
        "rust-x", people(), llm=stage.llm, protocol="cross-pollination", budget=Budget(max_calls=4)
    )
    result = await d.run(TOPIC)
    assert result.status == "failed"
    assert "budget max_calls=4 reached" in result.error
    assert result.calls == 4
    assert [r.phase for r in result.rounds] == ["position"]


async def test_deadline_fails_a_slow_debate_promptly(make_stage):
    # 200 rounds of 0.1 s calls take 20 s and more; the deadline ends the debate at 0.5 s. The
    # upper bound leaves a loaded machine seconds to spare and still fails a debate that runs on.
    stage = make_stage(delay=0.1)
    d = Debate("slow", people(("alice", "bob")), llm=stage.llm, max_rounds=200, deadline_s=0.5)
    started = time.perf_counter()
    result = await d.run(TOPIC)
    elapsed = time.perf_counter() - started

    assert result.status == "failed"
    assert result.error == "debate 'slow' exceeded its deadline of 0.5 s"
    assert 0.5 <= elapsed < 10.0
    assert len(result.rounds) < 200
    assert result.calls == len(stage.requests)
    # Every call but the one cut off by the deadline was answered and charged.
    answered = stage.requests[:-1]
    expected = sum((word_usage(r, stage.text_for(r)) for r in answered), start=TokenUsage())
    assert result.token_usage == expected


async def test_a_generous_deadline_does_not_interfere(make_stage):
    result = await Debate("quick", people(), llm=make_stage().llm, deadline_s=30).run(TOPIC)
    assert result.status == "completed"
