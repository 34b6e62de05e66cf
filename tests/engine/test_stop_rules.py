"""When a stop rule may end a debate: ``min_rounds`` first, and a verdict that says nothing (an
empty summary, or the schema's own text copied back) is no consensus."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from debatebus import Debate, Judge, Participant
from debatebus._demo import build_debate
from debatebus.engine import DebateState, Verdict
from debatebus.engine._rules import consensus_reached, empty_verdict
from debatebus.exceptions import ConfigError
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM

TOPIC = "Should the city build a tram line?"


def people() -> list[Participant]:
    return [Participant("alice", "For."), Participant("bob", "Against.")]


def judged(summary: str, consensus: bool = True) -> FunctionLLM:
    """Every turn says a line; the judge always rules ``consensus`` with ``summary``."""

    def answer(request: LLMRequest) -> str:
        if request.purpose == "judge":
            return json.dumps({"consensus": consensus, "summary": summary})
        return f"{request.speaker} says something in round {request.round}"

    return FunctionLLM(answer)


def judge_rounds(llm: FunctionLLM) -> list[int]:
    return [r.round for r in llm.requests if r.purpose == "judge"]


async def test_the_judge_cannot_stop_the_debate_before_min_rounds() -> None:
    llm = judged("Both agree the tram pays off.")
    result = await Debate("tram", people(), llm=llm, judge=Judge(), max_rounds=4,
                          min_rounds=3).run(TOPIC)
    assert [r.number for r in result.rounds] == [1, 2, 3]
    assert result.satisfied
    assert judge_rounds(llm) == [1, 2, 3]  # asked every round; heeded from round 3


async def test_without_min_rounds_the_judge_stops_after_the_first_round() -> None:
    llm = judged("Both agree the tram pays off.")
    result = await Debate("tram", people(), llm=llm, judge=Judge(), max_rounds=4).run(TOPIC)
    assert [r.number for r in result.rounds] == [1]
    assert result.satisfied


async def test_min_rounds_holds_back_until_too() -> None:
    seen: list[int] = []

    def until(state: DebateState) -> bool:
        seen.append(state.round)
        return True

    llm = judged("unused")
    result = await Debate("tram", people(), llm=llm, until=until, max_rounds=3,
                          min_rounds=2).run(TOPIC)
    assert [r.number for r in result.rounds] == [1, 2]
    assert seen == [2]  # not even asked after round 1
    assert result.satisfied


@pytest.mark.parametrize("summary", [
    "", "   ", "The judge's ruling on the debate.", "the judge’s ruling on the debate",
    "Summary", "summary:", '"Verdict"',
])
async def test_a_verdict_that_says_nothing_is_no_consensus(summary: str) -> None:
    llm = judged(summary)
    result = await Debate("tram", people(), llm=llm, judge=Judge(), max_rounds=3).run(TOPIC)
    assert [r.number for r in result.rounds] == [1, 2, 3]  # played to the cap
    assert not result.satisfied
    assert isinstance(result.verdict, Verdict) and result.verdict.consensus


def test_empty_verdict_reads_the_schema_of_the_verdict_it_is_given() -> None:
    class Ruling(BaseModel):
        """Whether the panel agrees."""

        consensus: bool
        summary: str
        rationale: str = ""

    assert empty_verdict(Ruling(consensus=True, summary="Whether the panel agrees."))
    assert empty_verdict(Ruling(consensus=True, summary="Rationale"))
    assert not empty_verdict(Ruling(consensus=True, summary="The panel agrees on 42."))
    # The default verdict's description is no boilerplate for another schema's summary...
    assert not empty_verdict(Ruling(consensus=True, summary="The judge's ruling on the debate."))

    class Flag(BaseModel):
        consensus: bool

    # ...and a schema without a summary keeps its consensus flag.
    assert not empty_verdict(Flag(consensus=True))
    assert consensus_reached(Flag(consensus=True))
    assert not consensus_reached(Verdict(consensus=True, summary=""))
    assert consensus_reached(Verdict(consensus=True, summary="They settled on 42."))


@pytest.mark.parametrize(("options", "message"), [
    ({"min_rounds": 0}, "min_rounds must be an integer ≥ 1, got 0"),
    ({"min_rounds": 4, "max_rounds": 3}, "min_rounds=4 is over max_rounds=3"),
    ({"min_rounds": 3, "protocol": "cross-pollination"},
     "cross-pollination plays 2 rounds .* pass min_rounds ≤ 2"),
])
def test_min_rounds_is_checked_at_construction(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Debate("tram", people(), llm=judged("x"), judge=Judge(), **options)  # type: ignore[arg-type]


def test_min_rounds_is_part_of_the_definition_hash_only_when_set() -> None:
    llm = judged("x")
    plain = Debate("tram", people(), llm=llm, judge=Judge())
    assert Debate("tram", people(), llm=llm, judge=Judge(), min_rounds=1).definition_hash == (
        plain.definition_hash)
    assert Debate("tram", people(), llm=llm, judge=Judge(), min_rounds=2).definition_hash != (
        plain.definition_hash)


async def test_the_demo_judge_cannot_end_the_demo_before_the_rebuttals() -> None:
    llm = judged("Everyone agrees.")
    demo = build_debate(llm)
    assert demo.spec.min_rounds == 2
    result = await demo.run(TOPIC)
    assert [r.phase for r in result.rounds] == ["opening", "rebuttal"]
    assert result.satisfied
    # A one-round demo (debatebus run --rounds 1) still runs.
    assert build_debate(llm, rounds=1).spec.min_rounds == 1
