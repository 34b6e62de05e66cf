"""Round-robin: call order, what every speaker saw, the stop rules, windows and output."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from debatebus import Debate, Judge, Participant
from debatebus.engine import DebateState, Prompts, Verdict
from debatebus.engine._definition import DEFAULT_JUDGE_PROMPT
from debatebus.engine._prompts import SHARED_SYSTEM
from debatebus.schemas import events as ev

TOPIC = "Should cities ban cars from their centres?"
NAMES = ("alice", "bob", "carol")

# Bare templates: each prompt is exactly the transcript that speaker was shown.
BARE = Prompts(
    opening="{transcript}", rebuttal="{transcript}", judge="{transcript}", synthesis="{transcript}"
)

R1 = "Round 1:\nalice said:\n> alice opening 1\nbob said:\n> bob opening 1\ncarol said:\n> carol opening 1"
R2 = "Round 2:\nalice said:\n> alice rebuttal 2\nbob said:\n> bob rebuttal 2\ncarol said:\n> carol rebuttal 2"
R3 = "Round 3:\nalice said:\n> alice rebuttal 3\nbob said:\n> bob rebuttal 3\ncarol said:\n> carol rebuttal 3"


def people() -> list[Participant]:
    return [Participant(name, f"You are {name}, a city planner.") for name in NAMES]


def debate(stage, **options) -> Debate:
    options.setdefault("llm", stage.llm)
    return Debate("cars", people(), **options)


async def test_call_order_with_moderator_and_judge(make_stage):
    stage = make_stage()
    d = debate(
        stage, moderator=Participant("moderator", "You moderate."), judge=Judge(), max_rounds=2
    )
    result = await d.run(TOPIC)

    assert stage.keys == [
        ("moderator", "framing", 0),
        ("alice", "opening", 1),
        ("bob", "opening", 1),
        ("carol", "opening", 1),
        ("judge", "judge", 1),
        ("alice", "rebuttal", 2),
        ("bob", "rebuttal", 2),
        ("carol", "rebuttal", 2),
        ("judge", "judge", 2),
        ("moderator", "synthesis", 2),
    ]
    assert result.calls == 10
    assert [r.number for r in result.rounds] == [1, 2]
    assert [[t.speaker for t in r.turns] for r in result.rounds] == [list(NAMES)] * 2
    assert [r.phase for r in result.rounds] == ["opening", "rebuttal"]
    assert result.framing == "moderator framing 0"
    assert result.synthesis == "moderator synthesis 2"
    assert result.output == "moderator synthesis 2"


async def test_each_speaker_sees_topic_framing_and_everything_said_before_it(make_stage):
    stage = make_stage()
    d = debate(
        stage,
        moderator=Participant("moderator", "You moderate."),
        judge=Judge(),
        max_rounds=2,
        prompts=BARE,
    )
    await d.run(TOPIC)

    assert stage.prompt_of("alice", "opening", 1) == ""
    assert stage.prompt_of("bob", "opening", 1) == "Round 1:\nalice said:\n> alice opening 1"
    assert stage.prompt_of("carol", "opening", 1) == (
        "Round 1:\nalice said:\n> alice opening 1\nbob said:\n> bob opening 1"
    )
    assert stage.prompt_of("judge", "judge", 1) == R1
    assert stage.prompt_of("alice", "rebuttal", 2) == R1
    assert stage.prompt_of("bob", "rebuttal", 2) == f"{R1}\n\nRound 2:\nalice said:\n> alice rebuttal 2"
    assert stage.prompt_of("carol", "rebuttal", 2) == (
        f"{R1}\n\nRound 2:\nalice said:\n> alice rebuttal 2\nbob said:\n> bob rebuttal 2"
    )
    assert stage.prompt_of("judge", "judge", 2) == f"{R1}\n\n{R2}"
    assert stage.prompt_of("moderator", "synthesis", 2) == f"{R1}\n\n{R2}"


async def test_shipped_prompts_carry_question_framing_transcript_then_persona_and_task(make_stage):
    stage = make_stage()
    moderator = Participant("moderator", "You moderate fairly.")
    d = debate(stage, moderator=moderator, judge=Judge(), max_rounds=2)
    await d.run(TOPIC)

    framing = stage.prompt_of("moderator", "framing", 0)
    assert TOPIC in framing
    assert "alice, bob, carol" in framing
    assert "Now it is moderator's turn. You moderate fairly.\nFrame this debate" in framing
    shared = f"Debate topic: {TOPIC}\nFraming: moderator framing 0\nParticipants: alice, bob, carol"
    opening = stage.prompt_of("bob", "opening", 1)
    assert opening.startswith(
        f"{shared}\n\nTranscript so far:\nRound 1:\nalice said:\n> alice opening 1\n\n---\n"
        "Now it is bob's turn. You are bob, a city planner.\n"
    )
    assert opening.endswith("Round 1: give your opening position with your strongest arguments, "
                            "in your own words only.")
    rebuttal = stage.prompt_of("alice", "rebuttal", 2)
    assert rebuttal.startswith(f"{shared}\n\nTranscript so far:\n{R1}\n\n---\n")
    assert "Now it is alice's turn. You are alice, a city planner.\nRound 2: respond" in rebuttal
    judge_prompt = stage.prompt_of("judge", "judge", 2)
    assert judge_prompt.startswith(f"{shared}\n\nTranscript so far:\n{R1}\n\n{R2}\n\n---\n")
    assert f"Now it is judge's turn. {DEFAULT_JUDGE_PROMPT}\nAfter round 2" in judge_prompt
    synthesis = stage.prompt_of("moderator", "synthesis", 2)
    assert synthesis.startswith(f"{shared}\n\nTranscript so far:\n{R1}\n\n{R2}\n\n---\n")

    # One system prompt for every call: personas differ only at the end of the prompt.
    assert {r.system for r in stage.requests} == {SHARED_SYSTEM}
    schemas = {r.purpose: r.response_schema for r in stage.requests}
    assert schemas == {
        "framing": None,
        "opening": None,
        "rebuttal": None,
        "judge": Verdict,
        "synthesis": None,
    }
    assert all(len(r.messages) == 1 and r.messages[0].role == "user" for r in stage.requests)


async def test_heterogeneous_llms_each_get_only_their_own_calls(make_stage):
    default, alice_llm, judge_llm, synth_llm = (make_stage(model=m) for m in "dajs")
    participants = [
        Participant("alice", "A", llm=alice_llm.llm),
        Participant("bob", "B"),
        Participant("carol", "C"),
    ]
    d = Debate(
        "mixed",
        participants,
        llm=default.llm,
        moderator=Participant("moderator", "M"),
        synthesizer=Participant("synth", "S", llm=synth_llm.llm),
        judge=Judge(llm=judge_llm.llm),
        max_rounds=2,
    )
    result = await d.run(TOPIC)

    assert alice_llm.keys == [("alice", "opening", 1), ("alice", "rebuttal", 2)]
    assert judge_llm.keys == [("judge", "judge", 1), ("judge", "judge", 2)]
    assert synth_llm.keys == [("synth", "synthesis", 2)]
    assert default.keys == [
        ("moderator", "framing", 0),
        ("bob", "opening", 1),
        ("carol", "opening", 1),
        ("bob", "rebuttal", 2),
        ("carol", "rebuttal", 2),
    ]
    assert result.synthesis == "synth synthesis 2"
    assert result.framing == "moderator framing 0"


async def test_consensus_stops_the_debate_and_is_satisfied(make_stage):
    stage = make_stage(consensus_at=2)
    d = debate(stage, moderator=Participant("moderator", "M"), judge=Judge(), max_rounds=5)
    result = await d.run(TOPIC)

    assert [r.number for r in result.rounds] == [1, 2]
    assert result.status == "completed"
    assert result.satisfied is True
    assert isinstance(result.verdict, Verdict)
    assert result.verdict.consensus is True
    assert [r.verdict.consensus for r in result.rounds] == [False, True]
    assert stage.keys[-1] == ("moderator", "synthesis", 2)
    assert ("alice", "rebuttal", 3) not in stage.keys


async def test_until_replaces_the_consensus_rule(make_stage):
    stage = make_stage(consensus_at=1)  # the judge agrees at once: ignored because until is given
    seen: list[DebateState] = []

    def until(state: DebateState) -> bool:
        seen.append(state)
        return state.round >= 3

    d = debate(stage, judge=Judge(), until=until, max_rounds=5)
    result = await d.run(TOPIC)

    assert [r.number for r in result.rounds] == [1, 2, 3]
    assert result.satisfied is True
    assert result.status == "completed"
    assert [s.round for s in seen] == [1, 2, 3]
    assert [len(s.rounds) for s in seen] == [1, 2, 3]
    assert all(s.verdict.consensus is True for s in seen)
    assert all(s.question == TOPIC for s in seen)
    assert [s.calls for s in seen] == [4, 8, 12]  # three turns and a verdict per round
    totals = [s.token_usage.total_tokens for s in seen]
    assert totals == sorted(totals)
    assert totals[0] > 0
    assert seen[-1].transcript.round(2).turns[0].text == "alice rebuttal 2"


async def test_until_without_a_judge(make_stage):
    stage = make_stage()
    d = debate(stage, until=lambda s: "bob rebuttal 2" in s.transcript.render(), max_rounds=4)
    result = await d.run(TOPIC)

    assert [r.number for r in result.rounds] == [1, 2]
    assert result.satisfied is True
    assert result.verdict is None


async def test_round_cap_is_an_outcome_not_a_failure(make_stage):
    stage = make_stage(consensus_at=None)
    d = debate(stage, judge=Judge(), max_rounds=3)
    result = await d.run(TOPIC)

    assert [r.number for r in result.rounds] == [1, 2, 3]
    assert result.status == "completed"
    assert result.ok is True
    assert result.satisfied is False
    assert result.error is None
    assert result.verdict.consensus is False
    assert result.verdict.summary == "after round 3"


async def test_until_never_true_hits_the_cap_unsatisfied(make_stage):
    stage = make_stage()
    result = await debate(stage, until=lambda s: False, max_rounds=2).run(TOPIC)
    assert len(result.rounds) == 2
    assert result.satisfied is False
    assert result.status == "completed"


async def test_without_judge_or_until_all_rounds_run_unsatisfied(make_stage):
    stage = make_stage()
    result = await debate(stage, max_rounds=2).run(TOPIC)
    assert len(result.rounds) == 2
    assert result.satisfied is False
    assert all(r.verdict is None for r in result.rounds)


async def test_without_synthesis_the_output_is_the_last_rounds_lines(make_stage):
    stage = make_stage()
    result = await debate(stage, max_rounds=2).run(TOPIC)
    assert result.synthesis is None
    assert result.framing is None
    assert result.output == "alice: alice rebuttal 2\nbob: bob rebuttal 2\ncarol: carol rebuttal 2"
    assert all(k[1] != "synthesis" for k in stage.keys)


async def test_synthesizer_writes_the_synthesis_instead_of_the_moderator(make_stage):
    stage = make_stage()
    d = debate(
        stage,
        moderator=Participant("moderator", "M"),
        synthesizer=Participant("writer", "W"),
        max_rounds=1,
    )
    result = await d.run(TOPIC)
    assert stage.keys[0] == ("moderator", "framing", 0)
    assert stage.keys[-1] == ("writer", "synthesis", 1)
    assert result.synthesis == "writer synthesis 1"
    assert [k for k in stage.keys if k[0] == "moderator"] == [("moderator", "framing", 0)]


async def test_run_max_rounds_lowers_the_cap_for_one_run(make_stage):
    stage = make_stage()
    d = debate(stage, max_rounds=3)
    assert len((await d.run(TOPIC, max_rounds=1)).rounds) == 1
    assert len((await d.run(TOPIC)).rounds) == 3


async def test_transcript_window_limits_debaters_but_not_judge_or_synthesis(make_stage):
    stage = make_stage()
    d = debate(
        stage,
        moderator=Participant("moderator", "M"),
        judge=Judge(),
        max_rounds=3,
        transcript_window=1,
        prompts=BARE,
    )
    await d.run(TOPIC)

    assert stage.prompt_of("alice", "rebuttal", 2) == R1
    assert stage.prompt_of("alice", "rebuttal", 3) == R2
    assert stage.prompt_of("bob", "rebuttal", 3) == f"{R2}\n\nRound 3:\nalice said:\n> alice rebuttal 3"
    assert stage.prompt_of("carol", "rebuttal", 3) == (
        f"{R2}\n\nRound 3:\nalice said:\n> alice rebuttal 3\nbob said:\n> bob rebuttal 3"
    )
    assert stage.prompt_of("judge", "judge", 3) == f"{R1}\n\n{R2}\n\n{R3}"
    assert stage.prompt_of("moderator", "synthesis", 3) == f"{R1}\n\n{R2}\n\n{R3}"


async def test_transcript_window_of_two_rounds(make_stage):
    stage = make_stage()
    d = debate(stage, max_rounds=3, transcript_window=2, prompts=BARE)
    await d.run(TOPIC)
    assert stage.prompt_of("alice", "rebuttal", 3) == f"{R1}\n\n{R2}"


async def test_phi_hat_compares_first_and_last_turns(make_stage, events):
    stage = make_stage()
    result = await debate(stage, max_rounds=3).run(TOPIC, on_event=events)
    # {"alice", "opening"} vs {"alice", "rebuttal"}: Jaccard distance 2/3 for every participant.
    assert result.phi_hat == pytest.approx(2 / 3)
    (update,) = events.of(ev.PhiUpdate)
    assert update.phi_hat == pytest.approx(2 / 3)
    assert update.level == "medium"


async def test_phi_hat_is_none_with_a_single_round(make_stage, events):
    result = await debate(make_stage(), max_rounds=1).run(TOPIC, on_event=events)
    assert result.phi_hat is None
    assert "phi_update" not in events.types


async def test_result_identity_and_transcript_view(make_stage):
    stage = make_stage()
    result = await debate(stage, max_rounds=2).run(TOPIC, debate_id="deb-1")

    assert result.debate_id == "deb-1"
    assert result.question == TOPIC
    assert result.debate_name == "cars"
    assert result.duration_ms > 0
    transcript = result.transcript
    assert len(transcript) == 2
    assert transcript.render() == f"{R1}\n\n{R2}"
    assert transcript.render(last_rounds=1) == R2
    assert [t.text for t in transcript.by_speaker("bob")] == ["bob opening 1", "bob rebuttal 2"]
    assert transcript.round(2).turns[2].text == "carol rebuttal 2"
    with pytest.raises(KeyError, match="no round 7"):
        transcript.round(7)


async def test_generated_debate_ids_are_unique(make_stage):
    d = debate(make_stage(), max_rounds=1)
    first, second = await d.run(TOPIC), await d.run(TOPIC)
    assert first.debate_id
    assert first.debate_id != second.debate_id


async def test_single_participant_round_robin_gets_a_synthesis(make_stage):
    stage = make_stage()
    d = Debate(
        "solo", [Participant("alice", "A")], llm=stage.llm, moderator=Participant("moderator", "M")
    )
    result = await d.run(TOPIC, max_rounds=1)
    assert result.synthesis == "moderator synthesis 1"


class Score(BaseModel):
    agreement: int


async def test_custom_judge_schema_feeds_until(make_stage):
    replies = {("judge", "judge", n): f'{{"agreement": {n * 30}}}' for n in range(1, 6)}
    stage = make_stage(replies=replies)
    d = debate(
        stage,
        judge=Judge(schema=Score),
        until=lambda s: s.verdict.agreement >= 60,
        max_rounds=5,
    )
    result = await d.run(TOPIC)

    assert [r.verdict for r in result.rounds] == [Score(agreement=30), Score(agreement=60)]
    assert result.satisfied is True
    assert [r.response_schema for r in stage.requests if r.purpose == "judge"] == [Score, Score]


async def test_consecutive_calls_share_everything_but_the_last_speaker_s_persona_and_task(make_stage):
    stage = make_stage()
    await debate(stage, judge=Judge(), max_rounds=2).run(TOPIC)

    bob, carol = stage.prompt_of("bob", "rebuttal", 2), stage.prompt_of("carol", "rebuttal", 2)
    judge = stage.prompt_of("judge", "judge", 2)
    before_persona = bob.index("\n\n---\nNow it is bob's turn")
    assert carol.startswith(bob[:before_persona])
    assert judge.startswith(carol[: carol.index("\n\n---\nNow it is carol's turn")])


async def test_templates_without_a_persona_field_keep_the_persona_as_system_prompt(make_stage):
    stage = make_stage()
    await debate(stage, judge=Judge(), max_rounds=1, prompts=BARE).run(TOPIC)

    systems = {(r.speaker, r.purpose): r.system for r in stage.requests}
    assert systems[("bob", "opening")] == "You are bob, a city planner."
    assert systems[("judge", "judge")] == DEFAULT_JUDGE_PROMPT
