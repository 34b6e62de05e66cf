"""Failure policies: degrade and strict, survivors, role failures, empty answers."""

from __future__ import annotations

import pytest

from debatebus import Debate, Judge, Participant
from debatebus.engine import Prompts
from debatebus.exceptions import LLMError, LLMResponseError
from debatebus.llm import TokenUsage
from debatebus.schemas import events as ev
from debatebus.testing import ScriptedLLM

TOPIC = "Is remote work better for teams?"
NAMES = ("alice", "bob", "carol")
BARE = Prompts(opening="{transcript}", rebuttal="{transcript}", synthesis="{transcript}")


def people(names=NAMES) -> list[Participant]:
    return [Participant(n, f"You are {n}.") for n in names]


def round_robin(stage, **options) -> Debate:
    options.setdefault("llm", stage.llm)
    return Debate("remote", people(), **options)


def cross(stage, **options) -> Debate:
    options.setdefault("llm", stage.llm)
    return Debate("remote-x", people(), protocol="cross-pollination", **options)


# ---- degrade (the default) ------------------------------------------------------------------


async def test_degrade_records_a_failed_turn_and_goes_on(make_stage, events):
    stage = make_stage(failures={("bob", "opening", 1): RuntimeError("boom")})
    result = await round_robin(stage, max_rounds=2, prompts=BARE).run(TOPIC, on_event=events)

    assert result.status == "completed"
    assert result.error is None
    bob = result.rounds[0].turns[1]
    assert bob.speaker == "bob"
    assert bob.failed is True
    assert bob.text == ""
    assert bob.error == "RuntimeError: boom"
    assert bob.usage == TokenUsage()
    assert result.rounds[1].turns[1].failed is False  # bob speaks again in round 2
    # A failed turn is not shown to later speakers.
    assert stage.prompt_of("carol", "opening", 1) == "Round 1:\nalice said:\n> alice opening 1"
    assert "bob said" not in stage.prompt_of("alice", "rebuttal", 2)
    (failed,) = events.of(ev.TurnFailed)
    assert (failed.speaker, failed.round, failed.text) == ("bob", 1, "")
    assert failed.error == "RuntimeError: boom"


async def test_degrade_keeps_the_usage_an_llm_error_carries(make_stage):
    charged = TokenUsage.of(11, 2)
    stage = make_stage(failures={("alice", "opening", 1): LLMError("cut off", usage=charged)})
    result = await round_robin(stage, max_rounds=1).run(TOPIC)

    turn = result.rounds[0].turns[0]
    assert turn.failed is True
    assert turn.usage == charged
    assert turn.error == "LLMError: cut off"
    assert result.token_usage == stage.expected_usage()
    assert result.rounds[0].usage == stage.expected_usage()


async def test_one_survivor_in_the_last_round_becomes_the_output_without_synthesis(make_stage):
    failures = {
        ("alice", "rebuttal", 2): RuntimeError("down"),
        ("bob", "rebuttal", 2): RuntimeError("down"),
    }
    stage = make_stage(failures=failures)
    moderator = Participant("moderator", "M")
    result = await round_robin(stage, moderator=moderator, max_rounds=2).run(TOPIC)

    assert result.status == "completed"
    assert result.output == "carol rebuttal 2"
    assert result.synthesis is None
    assert ("moderator", "synthesis", 2) not in stage.keys
    assert result.token_usage == stage.expected_usage()


async def test_every_participant_failing_in_the_first_round_fails_the_debate(make_stage):
    failures = {(n, "opening", 1): LLMError("down", usage=TokenUsage.of(3, 0)) for n in NAMES}
    stage = make_stage(failures=failures)
    result = await round_robin(stage, judge=Judge(), max_rounds=3).run(TOPIC)

    assert result.status == "failed"
    assert result.satisfied is False
    assert "every participant failed in round 1" in result.error
    assert "LLMError: down" in result.error
    assert result.rounds == []
    assert ("judge", "judge", 1) not in stage.keys
    assert result.token_usage == TokenUsage.of(9, 0)
    assert result.token_usage == stage.expected_usage()


async def test_cross_pollination_failed_revision_falls_back_to_the_position(make_stage):
    stage = make_stage(failures={("bob", "revision", 2): RuntimeError("timeout")})
    result = await cross(stage).run(TOPIC)

    assert result.status == "completed"
    revision = result.rounds[1]
    assert [t.failed for t in revision.turns] == [False, True, False]
    synthesis_prompt = stage.prompt_of("synthesis", "synthesis", 2)
    assert "[bob] bob position 1" in synthesis_prompt
    assert "[alice] alice revision 2" in synthesis_prompt
    # alice and carol moved by 2/3, bob (fallen back to his position) by 0.
    assert result.phi_hat == pytest.approx(4 / 9)


async def test_cross_pollination_all_revisions_failing_fall_back_to_the_positions(make_stage):
    failures = {(n, "revision", 2): RuntimeError("down") for n in NAMES}
    stage = make_stage(failures=failures)
    result = await cross(stage).run(TOPIC)

    assert result.status == "completed"
    assert all(t.failed for t in result.rounds[1].turns)
    assert result.phi_hat == 0.0
    synthesis_prompt = stage.prompt_of("synthesis", "synthesis", 2)
    assert all(f"[{n}] {n} position 1" in synthesis_prompt for n in NAMES)
    assert result.output == "synthesis synthesis 2"


async def test_cross_pollination_failed_position_skips_the_revision(make_stage):
    stage = make_stage(failures={("carol", "position", 1): RuntimeError("down")})
    result = await cross(stage).run(TOPIC)

    assert [k for k in stage.keys if k[1] == "revision"] == [
        ("alice", "revision", 2),
        ("bob", "revision", 2),
    ]
    assert "carol" not in stage.prompt_of("alice", "revision", 2)
    assert result.status == "completed"


async def test_cross_pollination_single_survivor_is_the_output_without_synthesis(make_stage):
    failures = {(n, "position", 1): RuntimeError("down") for n in ("alice", "carol")}
    stage = make_stage(failures=failures)
    result = await cross(stage).run(TOPIC)

    assert result.status == "completed"
    assert result.output == "bob position 1"
    assert result.synthesis is None
    assert result.phi_hat is None
    assert [k[1] for k in stage.keys] == ["position"] * 3
    assert len(result.rounds) == 1


async def test_cross_pollination_all_positions_failing_fails_the_debate(make_stage):
    failures = {(n, "position", 1): RuntimeError("down") for n in NAMES}
    stage = make_stage(failures=failures)
    result = await cross(stage).run(TOPIC)

    assert result.status == "failed"
    assert "every participant failed in round 1 (position)" in result.error
    assert [k[1] for k in stage.keys] == ["position"] * 3
    assert result.rounds == []


# ---- strict ---------------------------------------------------------------------------------


async def test_strict_fails_on_any_participant_failure(make_stage, events):
    stage = make_stage(failures={("bob", "rebuttal", 2): ValueError("bad gateway")})
    d = round_robin(stage, failure_policy="strict", judge=Judge(), max_rounds=3)
    result = await d.run(TOPIC, on_event=events)

    assert result.status == "failed"
    assert result.error == (
        "participant 'bob' failed in round 2 (rebuttal): ValueError: bad gateway"
    )
    assert [r.number for r in result.rounds] == [1]  # the rounds completed so far
    assert ("carol", "rebuttal", 2) not in stage.keys
    assert result.calls == len(stage.requests) == 6
    assert result.token_usage == stage.expected_usage()
    assert events.types[-2:] == ["turn_failed", "debate_failed"]


async def test_strict_cross_pollination_fails_on_a_position_failure(make_stage):
    stage = make_stage(failures={("alice", "position", 1): RuntimeError("down")})
    result = await cross(stage, failure_policy="strict").run(TOPIC)

    assert result.status == "failed"
    assert "participant 'alice' failed in round 1 (position)" in result.error
    assert all(k[1] == "position" for k in stage.keys)
    assert result.calls == len(stage.requests)
    assert result.token_usage == stage.expected_usage()


async def test_strict_completes_when_nothing_fails(make_stage):
    result = await round_robin(make_stage(), failure_policy="strict", max_rounds=2).run(TOPIC)
    assert result.status == "completed"


# ---- roles fail the debate under either policy ----------------------------------------------


@pytest.mark.parametrize("policy", ["degrade", "strict"])
async def test_judge_failure_fails_the_debate(make_stage, policy):
    charged = TokenUsage.of(40, 0)
    stage = make_stage(failures={("judge", "judge", 2): LLMError("overloaded", usage=charged)})
    d = round_robin(stage, judge=Judge(), failure_policy=policy, max_rounds=3)
    result = await d.run(TOPIC)

    assert result.status == "failed"
    assert result.error == "judge by 'judge' failed in round 2: LLMError: overloaded"
    assert [r.number for r in result.rounds] == [1]
    assert result.token_usage == stage.expected_usage()
    assert stage.keys[-1] == ("judge", "judge", 2)


async def test_judge_answer_that_is_not_a_verdict_fails_the_debate(make_stage):
    stage = make_stage(replies={("judge", "judge", 1): "They mostly agree, I think."})
    result = await round_robin(stage, judge=Judge(), max_rounds=2).run(TOPIC)

    assert result.status == "failed"
    assert "did not return a valid Verdict" in result.error
    assert "They mostly agree" in result.error
    assert result.rounds == []
    assert result.token_usage == stage.expected_usage()


async def test_judge_answer_in_prose_around_json_is_parsed(make_stage):
    reply = 'Ruling: {"consensus": true, "summary": "agreed", "winner": "bob"} done'
    stage = make_stage(replies={("judge", "judge", 1): reply})
    result = await round_robin(stage, judge=Judge(), max_rounds=3).run(TOPIC)
    assert result.status == "completed"
    assert result.satisfied is True
    assert result.verdict.winner == "bob"


@pytest.mark.parametrize("policy", ["degrade", "strict"])
async def test_synthesis_failure_fails_the_debate_and_keeps_all_rounds(make_stage, policy):
    stage = make_stage(failures={("moderator", "synthesis", 2): RuntimeError("500")})
    moderator = Participant("moderator", "M")
    d = round_robin(stage, moderator=moderator, failure_policy=policy, max_rounds=2)
    result = await d.run(TOPIC)

    assert result.status == "failed"
    assert result.error == "synthesis by 'moderator' failed in round 2: RuntimeError: 500"
    assert [r.number for r in result.rounds] == [1, 2]
    assert result.framing == "moderator framing 0"
    assert result.synthesis is None
    assert result.token_usage == stage.expected_usage()


async def test_cross_pollination_synthesis_failure_fails_the_debate(make_stage):
    stage = make_stage(failures={("synthesis", "synthesis", 2): RuntimeError("500")})
    result = await cross(stage).run(TOPIC)
    assert result.status == "failed"
    assert "synthesis by 'synthesis' failed in round 2" in result.error
    assert len(result.rounds) == 2
    assert result.phi_hat is not None  # computed before the synthesis call


async def test_framing_failure_fails_the_debate(make_stage, events):
    stage = make_stage(failures={("moderator", "framing", 0): RuntimeError("nope")})
    result = await round_robin(stage, moderator=Participant("moderator", "M")).run(
        TOPIC, on_event=events
    )
    assert result.status == "failed"
    assert result.error == "framing by 'moderator' failed in round 0: RuntimeError: nope"
    assert result.rounds == []
    assert result.output == ""
    assert events.types == ["debate_started", "debate_failed"]


async def test_a_failed_debate_is_returned_not_raised_with_scripted_exhaustion():
    llm = ScriptedLLM(["a1", "b1"])  # one reply short of the first round
    result = await Debate("short", people(), llm=llm, failure_policy="strict").run(TOPIC)
    assert result.status == "failed"
    assert "ScriptExhaustedError" in result.error
    assert "call 3 (opening by carol, round 1)" in result.error


# ---- empty answers --------------------------------------------------------------------------


async def test_empty_responses_are_appended_as_is(make_stage):
    stage = make_stage(replies={("alice", "opening", 1): "", ("bob", "opening", 1): "   "})
    result = await round_robin(stage, max_rounds=1, prompts=BARE).run(TOPIC)

    alice, bob, _ = result.rounds[0].turns
    assert (alice.text, alice.failed, alice.error) == ("", False, None)
    assert (bob.text, bob.failed) == ("   ", False)
    assert stage.prompt_of("carol", "opening", 1) == "Round 1:\nalice said nothing.\nbob said nothing."
    assert result.output == "alice: \nbob:    \ncarol: carol opening 1"
    assert result.token_usage == stage.expected_usage()


async def test_empty_judge_response_fails_the_debate(make_stage):
    stage = make_stage(replies={("judge", "judge", 1): ""})
    result = await round_robin(stage, judge=Judge(), max_rounds=1).run(TOPIC)
    assert result.status == "failed"
    assert "did not return a valid Verdict" in result.error


async def test_llm_response_error_from_a_participant_is_a_failed_turn(make_stage):
    stage = make_stage(failures={("carol", "opening", 1): LLMResponseError("garbled")})
    result = await round_robin(stage, max_rounds=1).run(TOPIC)
    assert result.rounds[0].turns[2].error == "LLMResponseError: garbled"
    assert result.output == "alice: alice opening 1\nbob: bob opening 1"
