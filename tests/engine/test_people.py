"""A person in the engine (no bus): their turn is asked of ``Debate.run(people=…)``, in either
protocol; without a runner it fails, saying how to reach them; what may be a person is checked
when the debate is built."""

from __future__ import annotations

import pytest

from debatebus import Debate, Participant
from debatebus.engine import HumanParticipant
from debatebus.engine._people import TurnRequest
from debatebus.exceptions import ConfigError
from debatebus.llm import LLMRequest
from debatebus.schemas import events as ev
from debatebus.testing import FunctionLLM

DANA = HumanParticipant("dana", event_type="debate:turn:dana", deadline_s=5)


def model(request: LLMRequest) -> str:
    return f"{request.speaker} on {request.purpose}"


async def test_a_person_speaks_through_the_runner_in_cross_pollination() -> None:
    asked: list[TurnRequest] = []

    async def dana(request: TurnRequest) -> str:
        asked.append(request)
        return f"dana's {request.phase}"

    prompts: dict[str, str] = {}

    def recording(request: LLMRequest) -> str:
        prompts[request.purpose] = request.prompt
        return model(request)

    debate = Debate("panel", [Participant("ann", "A."), DANA], llm=FunctionLLM(recording),
                    protocol="cross-pollination")
    result = await debate.run("Tabs or spaces?", debate_id="x", people=dana)

    assert result.ok
    assert [r.texts()["dana"] for r in result.rounds] == ["dana's position", "dana's revision"]
    position, revision = asked
    assert (position.record.key, revision.record.key) == ("x~turn-1-dana-1", "x~turn-2-dana-1")
    assert "ann on position" in revision.prompt  # she revises having read the others
    assert "dana's position" in prompts["revision"]  # and the others read her
    assert "dana's revision" in prompts["synthesis"]
    assert result.calls == 3  # ann twice and the synthesis: a person's turn is no model call


async def test_without_a_runner_a_persons_turn_fails_saying_how_to_reach_them() -> None:
    seen: list[ev.DebateEvent] = []
    debate = Debate("style", [Participant("ann", "A."), DANA], llm=FunctionLLM(model),
                    max_rounds=1)
    result = await debate.run("Tabs or spaces?", on_event=seen.append)
    assert result.ok  # degraded: the others went on
    (turn,) = [t for t in result.rounds[0].turns if t.speaker == "dana"]
    assert turn.failed and "serve this debate on a bus, or pass people=" in (turn.error or "")
    requested = [e for e in seen if isinstance(e, ev.TurnRequested)]
    assert [(e.speaker, e.event_type) for e in requested] == [("dana", "debate:turn:dana")]


def test_what_may_be_a_person_is_checked_when_the_debate_is_built() -> None:
    with pytest.raises(ConfigError, match="needs the event type"):
        HumanParticipant("dana", event_type="")
    with pytest.raises(ConfigError, match="deadline_s must be > 0"):
        HumanParticipant("dana", event_type="t", deadline_s=0)
    with pytest.raises(ConfigError, match="can only be one of the participants"):
        Debate("d", [Participant("ann", "A.")], llm=FunctionLLM(model), moderator=DANA)
    # A person needs no model, even where the debate has no default one.
    Debate("d", [Participant("ann", "A.", llm=FunctionLLM(model)), DANA])
    with pytest.raises(ConfigError, match="participant 'ann' has no LLM"):
        Debate("d", [Participant("ann", "A."), DANA])


def test_a_persons_event_type_is_part_of_the_definition() -> None:
    def with_person(event_type: str) -> Debate:
        return Debate("d", [Participant("ann", "A."),
                            HumanParticipant("dana", event_type=event_type)],
                      llm=FunctionLLM(model))

    assert with_person("a").definition_hash == with_person("a").definition_hash
    assert with_person("a").definition_hash != with_person("b").definition_hash
