"""Events: guaranteed order, sequence numbers, one terminal event, and the wire round trip."""

from __future__ import annotations

import asyncio
import json

import msgspec

from debatebus import Debate, Judge, Participant
from debatebus.engine import HumanParticipant, Verdict
from debatebus.engine._subdebates import SubDebates
from debatebus.llm import LLMRequest
from debatebus.schemas import events as ev
from debatebus.schemas.events import EVENT_DECODER
from debatebus.testing import FunctionLLM

TOPIC = "Tabs or spaces?"
NAMES = ("alice", "bob", "carol")
TERMINAL = {"debate_completed", "debate_failed"}
TURN_EVENTS = {"turn_completed", "turn_failed"}


def people() -> list[Participant]:
    return [Participant(n, f"You are {n}.") for n in NAMES]


def assert_well_formed(log, debate_id: str) -> None:
    assert [e.seq for e in log.events] == list(range(1, len(log.events) + 1))
    assert {e.debate_id for e in log.events} == {debate_id}
    assert log.types[0] == "debate_started"
    assert sum(t in TERMINAL for t in log.types) == 1
    assert log.types[-1] in TERMINAL


async def test_round_robin_event_order(make_stage, events):
    stage = make_stage()
    d = Debate(
        "style",
        people(),
        llm=stage.llm,
        moderator=Participant("moderator", "M"),
        judge=Judge(),
        max_rounds=2,
    )
    result = await d.run(TOPIC, debate_id="d-1", on_event=events, request_id="req-9")

    one_round = ["round_started", *["turn_completed"] * 3, "verdict", "round_completed"]
    assert events.types == [
        "debate_started",
        "framing_completed",
        *one_round,
        *one_round,
        "phi_update",
        "synthesis_completed",
        "debate_completed",
    ]
    assert_well_formed(events, "d-1")
    assert {e.request_id for e in events.events} == {"req-9"}

    started = events.events[0]
    assert isinstance(started, ev.DebateStarted)
    assert (started.question, started.debate_name, started.protocol) == (TOPIC, "style", "round-robin")
    assert (started.participants, started.max_rounds, started.resumed_from_round) == (
        list(NAMES),
        2,
        0,
    )
    assert [(e.round, e.phase) for e in events.of(ev.RoundStarted)] == [
        (1, "opening"),
        (2, "rebuttal"),
    ]
    turns = [(e.speaker, e.round, e.text, e.usage) for e in events.of(ev.TurnCompleted)]
    assert turns == [(t.speaker, t.round, t.text, t.usage) for r in result.rounds for t in r.turns]
    verdicts = events.of(ev.VerdictReached)
    assert [v.verdict for v in verdicts] == [
        r.verdict.model_dump(mode="json") for r in result.rounds
    ]
    assert events.of(ev.FramingCompleted)[0].text == result.framing
    assert events.of(ev.SynthesisCompleted)[0].text == result.synthesis
    (done,) = events.of(ev.DebateCompleted)
    assert (done.rounds, done.satisfied, done.output) == (2, False, result.output)
    assert done.token_usage == result.token_usage


async def test_a_failed_turn_emits_turn_failed_in_place(make_stage, events):
    stage = make_stage(failures={("bob", "opening", 1): RuntimeError("x")})
    await Debate("style", people(), llm=stage.llm, max_rounds=1).run(TOPIC, on_event=events)
    assert events.types == [
        "debate_started",
        "round_started",
        "turn_completed",
        "turn_failed",
        "turn_completed",
        "round_completed",
        "debate_completed",
    ]


async def test_a_failed_debate_ends_with_exactly_one_debate_failed(make_stage, events):
    stage = make_stage(failures={("judge", "judge", 2): RuntimeError("x")})
    d = Debate("style", people(), llm=stage.llm, judge=Judge(), max_rounds=3)
    result = await d.run(TOPIC, debate_id="d-2", on_event=events)

    assert events.types[-3:] == ["turn_completed", "turn_completed", "debate_failed"]
    assert "round_completed" not in events.types[events.types.index("round_started", 2) :]
    assert_well_formed(events, "d-2")
    (failed,) = events.of(ev.DebateFailed)
    assert (failed.rounds, failed.error) == (1, result.error)


async def test_cross_pollination_turn_events_of_a_phase_may_interleave(events):
    delays = {"alice": 0.06, "bob": 0.03, "carol": 0.0}

    async def answer(request: LLMRequest) -> str:
        if request.purpose in ("position", "revision"):
            await asyncio.sleep(delays[request.speaker])
        if request.purpose == "judge":
            return '{"consensus": true, "summary": "ok"}'
        return f"{request.speaker} {request.purpose}"

    d = Debate(
        "style-x",
        people(),
        llm=FunctionLLM(answer),
        protocol="cross-pollination",
        moderator=Participant("moderator", "M"),
        judge=Judge(),
        audience="juniors",
    )
    result = await d.run(TOPIC, debate_id="d-3", on_event=events)

    assert events.types == [
        "debate_started",
        "framing_completed",
        "round_started",  # round 0: the audience
        "turn_completed",
        "round_completed",
        "round_started",
        *["turn_completed"] * 3,
        "round_completed",
        "round_started",
        *["turn_completed"] * 3,
        "verdict",
        "round_completed",
        "phi_update",
        "synthesis_completed",
        "debate_completed",
    ]
    assert_well_formed(events, "d-3")
    phases = [(e.round, e.phase) for e in events.of(ev.RoundStarted)]
    assert phases == [(0, "audience"), (1, "position"), (2, "revision")]
    # Turn events arrive as calls finish; the result keeps participants in list order.
    finished = [(e.round, e.speaker) for e in events.of(ev.TurnCompleted)]
    assert finished == [
        (0, "moderator"),  # the audience model
        (1, "carol"),
        (1, "bob"),
        (1, "alice"),
        (2, "carol"),
        (2, "bob"),
        (2, "alice"),
    ]
    assert [[t.speaker for t in r.turns] for r in result.rounds[1:]] == [list(NAMES)] * 2


async def test_async_on_event_is_awaited_in_order(make_stage):
    seen: list[int] = []

    async def on_event(event: ev.DebateEvent) -> None:
        await asyncio.sleep(0)
        seen.append(event.seq)

    await Debate("style", people(), llm=make_stage().llm, max_rounds=2).run(
        TOPIC, on_event=on_event
    )
    assert seen == list(range(1, len(seen) + 1))
    assert len(seen) == 1 + 2 * 5 + 1 + 1  # started, 2 × (start, 3 turns, end), phi, completed


async def _all_kinds_of_events(make_stage, log) -> None:
    stage = make_stage(failures={("bob", "opening", 1): RuntimeError("x")})
    full = Debate(
        "style",
        people(),
        llm=stage.llm,
        moderator=Participant("moderator", "M"),
        judge=Judge(),
        max_rounds=2,
    )
    await full.run(TOPIC, debate_id="a", on_event=log)
    broken = make_stage(failures={("moderator", "framing", 0): RuntimeError("y")})
    d = Debate("style", people(), llm=broken.llm, moderator=Participant("moderator", "M"))
    await d.run(TOPIC, debate_id="b", on_event=log)
    # Sub-debates: alice's child completes, bob's (an event type, no bus here) fails, carol's is
    # over the cap.
    marked = make_stage(replies={(n, "revision", 2): "x\nREQUEST_SUB_DEBATE: " + d
                                 for n, d in (("alice", "s"), ("bob", "bus"), ("carol", "s"))})
    child = Debate("child", people(), llm=marked.llm, protocol="cross-pollination")
    config = SubDebates(domains={"s": child, "bus": "debate:bus"}, max_per_debate=2)
    parent = Debate("style", people(), llm=marked.llm, protocol="cross-pollination",
                    sub_debates=config)
    await parent.run(TOPIC, debate_id="c", on_event=log)
    # A person, with no one to reach them outside a bus: their turn is requested, then fails.
    with_person = Debate("style", [*people(), HumanParticipant("dana", event_type="debate:dana")],
                         llm=stage.llm, max_rounds=1)
    await with_person.run(TOPIC, debate_id="d", on_event=log)


async def test_every_event_round_trips_through_the_wire_decoder(make_stage, events):
    await _all_kinds_of_events(make_stage, events)
    # Every kind but turn deltas, which a streaming handler publishes, not the engine.
    assert {type(e) for e in events.events} == set(ev.EVENT_TYPES) - {ev.TurnDelta}

    for event in events.events:
        wire = msgspec.json.encode(event)
        assert EVENT_DECODER.decode(wire) == event
        payload = json.loads(wire)
        assert payload["type"] == event.kind
        assert payload["debateId"] == event.debate_id
        assert payload["seq"] == event.seq


async def test_verdict_events_carry_json_ready_verdicts(make_stage, events):
    stage = make_stage(consensus_at=1)
    await Debate("style", people(), llm=stage.llm, judge=Judge()).run(TOPIC, on_event=events)
    (verdict,) = events.of(ev.VerdictReached)
    assert Verdict.model_validate(verdict.verdict).consensus is True
    assert verdict.usage.total_tokens > 0


async def test_a_run_builds_only_the_kinds_of_event_its_listener_takes() -> None:
    """``event_types`` filters before anything is built: the listener gets just those kinds,
    numbered without gaps, and the debate is the same."""
    def answer(request: LLMRequest) -> object:
        if request.response_schema is not None:
            return Verdict(consensus=False, summary="go on")
        if request.speaker == "bob" and request.round == 2:
            raise RuntimeError("bob's model is down")
        return f"{request.speaker} speaks"

    def debate() -> Debate:
        return Debate("style", people(), llm=FunctionLLM(answer), judge=Judge(),
                      moderator=Participant("moderator", "M"), max_rounds=3)

    every: list[ev.DebateEvent] = []
    some: list[ev.DebateEvent] = []
    full = await debate().run(TOPIC, on_event=every.append)
    kinds = frozenset((ev.DebateStarted, ev.TurnFailed, ev.DebateCompleted))
    filtered = await debate().run(TOPIC, on_event=some.append, event_types=kinds)
    assert len(every) > len(some) == 3
    assert [type(e) for e in some] == [ev.DebateStarted, ev.TurnFailed, ev.DebateCompleted]
    assert [e.seq for e in some] == [1, 2, 3]
    assert (filtered.output, filtered.token_usage, filtered.calls) == (
        full.output, full.token_usage, full.calls)
    assert [type(e) for e in every if type(e) in kinds] == [type(e) for e in some]
