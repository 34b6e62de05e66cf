"""``TurnDeltas``: a turn's pieces published at most every interval, in order, and a final delta
that makes the text exactly the committed one; ``TurnStreams`` marks a retry's turns re-runs."""

from __future__ import annotations

import asyncio

import pytest

from debatebus.engine._run import TurnKey
from debatebus.exceptions import ConfigError
from debatebus.handlers._streaming import TurnStreams
from debatebus.schemas.events import TurnDelta

KEY = TurnKey(2, "critic", "rebuttal")


class Published:
    def __init__(self) -> None:
        self.deltas: list[TurnDelta] = []
        self.arrived = asyncio.Event()

    async def publish(self, delta: TurnDelta) -> None:
        self.deltas.append(delta)
        self.arrived.set()

    async def next(self) -> TurnDelta:
        await asyncio.wait_for(self.arrived.wait(), 10)
        self.arrived.clear()
        return self.deltas[-1]


def text_of(deltas: list[TurnDelta]) -> str:
    """The turn's text as a reader rebuilds it: ``replace`` starts afresh, others extend."""
    text = ""
    for delta in deltas:
        text = delta.text if delta.replace else text + delta.text
    return text


def streams(published: Published, interval_s: float) -> TurnStreams:
    return TurnStreams(published.publish, "d-1", "r-1", interval_s=interval_s).for_run()


async def test_the_first_piece_goes_at_once_the_rest_waits_for_the_interval() -> None:
    published = Published()
    turn = streams(published, interval_s=3600)(KEY)
    turn.write("Tabs ")
    first = await published.next()
    for piece in ("are ", "better ", "than ", "spaces."):
        turn.write(piece)
    await asyncio.sleep(0)  # nothing is due: an hour must pass first
    assert len(published.deltas) == 1
    await turn.commit("Tabs are better than spaces.")
    final = published.deltas[-1]
    assert (first.seq, first.text, first.replace, first.final) == (1, "Tabs ", True, False)
    assert (final.seq, final.text, final.replace, final.final) == (2, "are better than spaces.",
                                                                   False, True)
    assert (final.round, final.speaker, final.purpose) == (2, "critic", "rebuttal")
    assert (final.debate_id, final.request_id, final.rerun) == ("d-1", "r-1", False)


async def test_pieces_after_the_interval_go_in_one_delta_each_time() -> None:
    published = Published()
    turn = streams(published, interval_s=0.05)(KEY)
    turn.write("one ")
    await published.next()
    turn.write("two ")
    turn.write("three ")
    second = await published.next()  # once 50 ms have passed since the first
    await turn.commit("one two three ")
    assert second.text == "two three "
    assert [d.seq for d in published.deltas] == [1, 2, 3]
    assert published.deltas[-1].text == ""
    assert text_of(published.deltas) == "one two three "


async def test_a_commit_that_cleaning_changed_replaces_the_text() -> None:
    published = Published()
    turn = streams(published, interval_s=3600)(KEY)
    turn.write("critic: ")
    await published.next()
    turn.write("No.\noptimist: Yes.")
    await turn.commit("No.")
    final = published.deltas[-1]
    assert (final.text, final.replace, final.final) == ("No.", True, True)
    assert text_of(published.deltas) == "No."


async def test_a_turn_with_no_piece_has_one_final_delta_and_a_discarded_turn_none() -> None:
    published = Published()
    make = streams(published, interval_s=3600)
    await make(KEY).commit("")
    (only,) = published.deltas
    assert (only.seq, only.text, only.replace, only.final) == (1, "", True, True)
    discarded = make(KEY)
    discarded.write("lost ")
    await published.next()
    discarded.write("words")
    discarded.discard()
    await discarded.commit("too late")
    assert [d.text for d in published.deltas] == ["", "lost "]


async def test_a_retry_marks_the_turns_an_earlier_attempt_may_have_streamed() -> None:
    published = Published()

    def reruns(stream: TurnStreams) -> list[bool]:
        return [stream(TurnKey(n, "a", "p")).rerun for n in range(6)]

    first = TurnStreams(published.publish, "d", "r")
    assert reruns(first.for_run(started_before=False, committed_rounds=0)) == [False] * 6
    resumed = TurnStreams(published.publish, "d", "r")
    assert reruns(resumed.for_run(started_before=True, committed_rounds=2)) == [True] * 5 + [False]
    redelivered = TurnStreams(published.publish, "d", "r", redelivered=True)
    assert reruns(redelivered.for_run()) == [True] * 6  # no store: every round runs again


def test_the_interval_is_checked() -> None:
    from debatebus import Debate, Participant
    from debatebus.testing import FunctionLLM

    debate = Debate("d", [Participant("a", "A")], llm=FunctionLLM(lambda r: "x"))
    for bad in (0, -1, float("nan"), 61):
        with pytest.raises(ConfigError, match="stream_interval_s"):
            debate.as_handler(stream_turns=True, stream_interval_s=bad)
