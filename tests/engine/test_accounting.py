"""Token accounting: the totals equal the sum over every call made, whatever the outcome."""

from __future__ import annotations

from debatebus import Debate, Judge, Participant
from debatebus.exceptions import LLMError
from debatebus.llm import TokenUsage
from debatebus.llm._fakes import word_usage
from debatebus.schemas import events as ev
from debatebus.testing import ScriptedLLM

TOPIC = "Four-day work week?"
NAMES = ("alice", "bob", "carol")


def people() -> list[Participant]:
    return [Participant(n, f"You are {n}, an economist.") for n in NAMES]


def total(usages) -> TokenUsage:
    result = TokenUsage()
    for usage in usages:
        result += usage
    return result


async def test_round_robin_totals_equal_the_sum_over_every_call(make_stage, events):
    stage = make_stage(consensus_at=3)
    d = Debate(
        "week",
        people(),
        llm=stage.llm,
        moderator=Participant("moderator", "M"),
        judge=Judge(),
        max_rounds=4,
    )
    result = await d.run(TOPIC, on_event=events)

    assert len(stage.requests) == 1 + 3 * (3 + 1) + 1  # framing, 3 × (turns + verdict), synthesis
    assert result.calls == len(stage.requests)
    assert result.token_usage == stage.expected_usage()
    assert result.token_usage.total_tokens == (
        result.token_usage.prompt_tokens + result.token_usage.completion_tokens
    )
    # Every turn carries its own call's usage.
    by_key = {(r.speaker, r.round): r for r in stage.requests if r.purpose != "judge"}
    for rnd in result.rounds:
        for turn in rnd.turns:
            assert turn.usage == word_usage(by_key[(turn.speaker, turn.round)], turn.text)
    # Rounds carry their turns and verdict; framing and synthesis are outside any round.
    outside = [r for r in stage.requests if r.purpose in ("framing", "synthesis")]
    outside_usage = total(word_usage(r, stage.text_for(r)) for r in outside)
    assert total(r.usage for r in result.rounds) + outside_usage == result.token_usage
    assert [e.usage for e in events.of(ev.RoundCompleted)] == [r.usage for r in result.rounds]
    (done,) = events.of(ev.DebateCompleted)
    assert done.token_usage == result.token_usage


async def test_cross_pollination_totals_with_audience_and_judge(make_stage):
    stage = make_stage(consensus_at=2)
    d = Debate(
        "week-x",
        people(),
        llm=stage.llm,
        protocol="cross-pollination",
        judge=Judge(),
        audience="small business owners",
    )
    result = await d.run(TOPIC)

    assert result.calls == len(stage.requests) == 1 + 3 + 3 + 1 + 1
    assert result.token_usage == stage.expected_usage()


async def test_heterogeneous_models_are_all_counted(make_stage):
    stages = [make_stage(model=f"m{i}") for i in range(4)]
    participants = [Participant(n, "P", llm=s.llm) for n, s in zip(NAMES, stages, strict=False)]
    d = Debate(
        "week-h",
        participants,
        judge=Judge(llm=stages[3].llm),
        synthesizer=Participant("writer", "W", llm=stages[3].llm),
        max_rounds=2,
    )
    result = await d.run(TOPIC)

    assert result.token_usage == total(s.expected_usage() for s in stages)
    assert result.calls == sum(len(s.requests) for s in stages) == 3 * 2 + 2 + 1


async def test_failed_debate_counts_every_token_including_llm_error_usage(make_stage, events):
    failures = {
        ("alice", "rebuttal", 2): LLMError("cut", usage=TokenUsage.of(7, 3)),
        ("judge", "judge", 2): LLMError("overloaded", usage=TokenUsage.of(50, 1)),
    }
    stage = make_stage(failures=failures)
    d = Debate(
        "week-f",
        people(),
        llm=stage.llm,
        moderator=Participant("moderator", "M"),
        judge=Judge(),
        max_rounds=3,
    )
    result = await d.run(TOPIC, on_event=events)

    assert result.status == "failed"
    assert result.calls == len(stage.requests) == 1 + 4 + 4
    assert result.token_usage == stage.expected_usage()
    succeeded = [r for r in stage.requests if (r.speaker, r.purpose, r.round) not in failures]
    expected = total(word_usage(r, stage.text_for(r)) for r in succeeded) + TokenUsage.of(57, 4)
    assert result.token_usage == expected
    (failed,) = events.of(ev.DebateFailed)
    assert failed.token_usage == result.token_usage
    assert failed.rounds == 1


async def test_strict_failure_counts_the_failed_calls_usage(make_stage):
    charged = TokenUsage.of(9, 9)
    stage = make_stage(failures={("bob", "opening", 1): LLMError("cut", usage=charged)})
    d = Debate("week-s", people(), llm=stage.llm, failure_policy="strict")
    result = await d.run(TOPIC)

    assert result.status == "failed"
    alice = stage.requests[0]
    assert result.token_usage == word_usage(alice, "alice opening 1") + charged
    assert result.token_usage == stage.expected_usage()


async def test_scripted_llm_usage_is_whitespace_word_counts():
    replies = ["one two", "three four five", "six", '{"consensus": true, "summary": "done"}']
    llm = ScriptedLLM(replies)
    d = Debate("script", people(), llm=llm, judge=Judge())
    result = await d.run(TOPIC)

    assert result.satisfied is True
    assert llm.remaining == 0
    assert [t.usage.completion_tokens for t in result.rounds[0].turns] == [2, 3, 1]
    expected = total(word_usage(r, text) for r, text in zip(llm.requests, replies, strict=True))
    assert result.token_usage == expected
    first = llm.requests[0]
    assert expected.prompt_tokens > 0
    assert word_usage(first, "x").prompt_tokens == len(first.system.split()) + len(
        first.prompt.split()
    )
