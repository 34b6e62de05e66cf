"""Cross-pollination: independent positions, revisions, a utility-weighing synthesis, concurrency."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, defaultdict

import pytest

from debatebus import Debate, Judge, Participant
from debatebus.engine import Utility, Verdict
from debatebus.engine._prompts import SHARED_SYSTEM
from debatebus.llm import LLMRequest
from debatebus.schemas import events as ev
from debatebus.testing import FunctionLLM

TOPIC = "How should the city spend its transport budget?"

UTILITIES = {
    "alice": Utility("rider comfort", "long waits"),
    "bob": Utility("low fares", "tax rises"),
    "carol": Utility("clean air", "diesel buses"),
}


def people() -> list[Participant]:
    return [Participant(n, f"You are {n}.", utility=u) for n, u in UTILITIES.items()]


def cross(stage, **options) -> Debate:
    options.setdefault("llm", stage.llm)
    return Debate("budget", people(), protocol="cross-pollination", **options)


def utility(name: str) -> str:
    u = UTILITIES[name]
    return f" You maximize: {u.maximizes}. You penalize: {u.penalizes}."


def position_line(name: str, text: str) -> str:
    return f"[{name}]{utility(name)} {text}"


async def test_call_order_positions_then_revisions_then_one_synthesis(make_stage):
    stage = make_stage()
    result = await cross(stage).run(TOPIC)

    assert stage.keys == [
        ("alice", "position", 1),
        ("bob", "position", 1),
        ("carol", "position", 1),
        ("alice", "revision", 2),
        ("bob", "revision", 2),
        ("carol", "revision", 2),
        ("synthesis", "synthesis", 2),
    ]
    assert [(r.number, r.phase) for r in result.rounds] == [(1, "position"), (2, "revision")]
    assert result.synthesis == "synthesis synthesis 2"
    assert result.output == result.synthesis
    assert result.status == "completed"
    assert result.satisfied is True  # no judge and no until: the protocol itself is the stop rule
    assert result.calls == 7


async def test_positions_are_independent(make_stage):
    stage = make_stage()
    await cross(stage).run(TOPIC)

    for name in UTILITIES:
        assert stage.prompt_of(name, "position", 1) == (
            f"Topic: {TOPIC}\n\n---\nNow it is {name}'s turn. You are {name}.{utility(name)}\n"
            "State your independent position. Answer in at most 60 words."
        )
        others = [n for n in UTILITIES if n != name]
        assert all(other not in stage.prompt_of(name, "position", 1) for other in others)


async def test_revisions_see_the_others_positions_with_their_utilities(make_stage):
    stage = make_stage()
    await cross(stage).run(TOPIC)

    others = "\n".join(
        [position_line("bob", "bob position 1"), position_line("carol", "carol position 1")]
    )
    assert stage.prompt_of("alice", "revision", 2) == (
        f"Topic: {TOPIC}\n\n---\nNow it is alice's turn. You are alice.{utility('alice')}\n"
        "The other participants' positions:\n"
        f"{others}\n\nRevise your position after considering theirs. Answer in at most 150 words."
    )
    bob = stage.prompt_of("bob", "revision", 2)
    assert position_line("alice", "alice position 1") in bob
    assert position_line("carol", "carol position 1") in bob
    assert "[bob]" not in bob


async def test_synthesis_weighs_every_revised_position_and_utility(make_stage):
    stage = make_stage()
    await cross(stage).run(TOPIC)

    revised = "\n".join(position_line(n, f"{n} revision 2") for n in UTILITIES)
    assert stage.prompt_of("synthesis", "synthesis", 2) == (
        f"Topic: {TOPIC}\nRevised positions, with what each participant maximizes and penalizes:\n"
        f"{revised}\n\n---\nNow it is synthesis's turn. You synthesize debates neutrally.\n"
        "Do not average the positions. Show the tensions between these utilities "
        "and the equilibrium that best respects them. Answer in at most 380 words."
    )
    (synthesis_request,) = [r for r in stage.requests if r.purpose == "synthesis"]
    assert synthesis_request.system == SHARED_SYSTEM  # the persona is in the prompt, last


async def test_default_word_limits_and_overrides(make_stage):
    stage = make_stage()
    await cross(stage, word_limits={"position": 25}).run(TOPIC)
    assert stage.prompt_of("bob", "position", 1).endswith(" Answer in at most 25 words.")
    assert stage.prompt_of("bob", "revision", 2).endswith(" Answer in at most 150 words.")
    assert stage.prompt_of("synthesis", "synthesis", 2).endswith(" Answer in at most 380 words.")


async def test_participants_without_utility_get_no_utility_text(make_stage):
    stage = make_stage()
    plain = [Participant("x", "X"), Participant("y", "Y")]
    await Debate("plain", plain, llm=stage.llm, protocol="cross-pollination").run(TOPIC)
    assert stage.prompt_of("x", "position", 1) == (
        f"Topic: {TOPIC}\n\n---\nNow it is x's turn. X\nState your independent position. "
        "Answer in at most 60 words."
    )
    assert "[y] y position 1" in stage.prompt_of("x", "revision", 2)
    assert "\n[x] x revision 2\n[y] y revision 2\n" in stage.prompt_of("synthesis", "synthesis", 2)


async def test_audience_round_zero_models_the_recipient_first(make_stage):
    stage = make_stage()
    result = await cross(stage, audience="retired bus drivers").run(TOPIC)

    assert stage.keys[0] == ("audience", "audience", 0)
    assert stage.prompt_of("audience", "audience", 0) == (
        f"Debate topic: {TOPIC}\nAudience: retired bus drivers\n\n---\nNow it is audience's turn. "
        "You model the audience of a debate.\nDescribe what this audience knows, "
        "needs and cares about, so the participants can address it. Answer in at most 120 words."
    )
    assert [(r.number, r.phase) for r in result.rounds] == [
        (0, "audience"),
        (1, "position"),
        (2, "revision"),
    ]
    assert result.rounds[0].turns[0].text == "audience audience 0"
    audience_line = "Audience: audience audience 0\n"
    assert stage.prompt_of("alice", "position", 1).startswith(f"Topic: {TOPIC}\n{audience_line}")
    assert audience_line in stage.prompt_of("carol", "revision", 2)
    assert stage.prompt_of("synthesis", "synthesis", 2).startswith(
        f"Topic: {TOPIC}\n{audience_line}"
    )


async def test_moderator_frames_models_the_audience_and_synthesizes(make_stage):
    stage = make_stage()
    moderator = Participant("moderator", "You moderate.")
    result = await cross(stage, moderator=moderator, audience="students").run(TOPIC)

    assert stage.keys[:2] == [("moderator", "framing", 0), ("moderator", "audience", 0)]
    assert stage.keys[-1] == ("moderator", "synthesis", 2)
    assert result.framing == "moderator framing 0"
    assert "Framing: moderator framing 0\n" in stage.prompt_of("alice", "position", 1)


async def test_synthesizer_is_preferred_over_the_moderator(make_stage):
    stage = make_stage()
    d = cross(
        stage, moderator=Participant("moderator", "M"), synthesizer=Participant("writer", "W")
    )
    result = await d.run(TOPIC)
    assert stage.keys[-1] == ("writer", "synthesis", 2)
    assert result.synthesis == "writer synthesis 2"


async def test_judge_rules_once_after_the_revisions_on_the_full_transcript(make_stage):
    stage = make_stage(consensus_at=None)
    result = await cross(stage, judge=Judge()).run(TOPIC)

    assert [k for k in stage.keys if k[0] == "judge"] == [("judge", "judge", 2)]
    judge_prompt = stage.prompt_of("judge", "judge", 2)
    assert "Round 1:\nalice said:\n> alice position 1\nbob said:\n> bob position 1" in judge_prompt
    assert "\n\nRound 2:\nalice said:\n> alice revision 2\nbob said:\n> bob revision 2" in judge_prompt
    assert result.rounds[0].verdict is None
    assert isinstance(result.rounds[1].verdict, Verdict)
    assert result.satisfied is False  # the judge saw no consensus
    assert result.status == "completed"
    assert result.synthesis == "synthesis synthesis 2"


async def test_judge_consensus_makes_the_outcome_satisfied(make_stage):
    result = await cross(make_stage(consensus_at=2), judge=Judge()).run(TOPIC)
    assert result.satisfied is True
    assert result.verdict.consensus is True


async def test_phi_hat_over_positions_and_revisions(make_stage, events):
    result = await cross(make_stage()).run(TOPIC, on_event=events)
    # {"alice", "position"} vs {"alice", "revision"}: 2/3 for everyone.
    assert result.phi_hat == pytest.approx(2 / 3)
    (update,) = events.of(ev.PhiUpdate)
    assert update.phi_hat == pytest.approx(2 / 3)
    assert update.level == "medium"


async def test_unchanged_revisions_give_phi_zero(make_stage):
    replies = {(n, "revision", 2): f"{n} position 1" for n in UTILITIES}
    result = await cross(make_stage(replies=replies)).run(TOPIC)
    assert result.phi_hat == 0.0


async def test_a_phase_of_three_slow_calls_runs_concurrently(make_stage):
    stage = make_stage()
    in_flight: Counter[tuple[str, int]] = Counter()
    peak: Counter[tuple[str, int]] = Counter()
    all_in: defaultdict[tuple[str, int], asyncio.Event] = defaultdict(asyncio.Event)

    async def slow_until_the_phase_is_in_flight(request: LLMRequest) -> str:
        """Each position and revision call answers once its phase's three calls are all in flight
        (after 5 s at most: calls made one after another would each wait that long, alone)."""
        phase = (request.purpose, request.round)
        in_flight[phase] += 1
        peak[phase] = max(peak[phase], in_flight[phase])
        if in_flight[phase] == 3:
            all_in[phase].set()
        try:
            if request.purpose != "synthesis":
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(all_in[phase].wait(), 5)
        finally:
            in_flight[phase] -= 1
        return stage.text_for(request)

    result = await cross(stage, llm=FunctionLLM(slow_until_the_phase_is_in_flight)).run(TOPIC)

    assert result.status == "completed"
    assert result.synthesis == "synthesis synthesis 2"
    # Three calls in flight at once in each phase, none waiting on another to finish; timed
    # bounds would tell nothing more, and fail on a slow machine.
    assert peak == {("position", 1): 3, ("revision", 2): 3, ("synthesis", 2): 1}
