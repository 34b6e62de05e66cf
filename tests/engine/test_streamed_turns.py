"""The engine streams free-text calls to ``on_text``: each piece as the model writes it, then the
turn's text as the transcript keeps it, committed before the turn is reported."""

from __future__ import annotations

from typing import Any

from debatebus import Debate, Judge, Participant
from debatebus.engine._run import TurnKey
from debatebus.exceptions import LLMError
from debatebus.llm import LLMRequest
from debatebus.schemas import events as ev
from debatebus.testing import FunctionLLM


class Recorder:
    """Every ``TurnText`` the run asked for, with what happened to it, and the events, in one
    log so their order shows."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.texts: list[Written] = []

    def on_text(self, key: TurnKey) -> Written:
        written = Written(self, key)
        self.texts.append(written)
        self.log.append(("open", key))
        return written

    def on_event(self, event: ev.DebateEvent) -> None:
        self.log.append(("event", event))

    def committed(self) -> dict[TurnKey, str]:
        return {w.key: w.committed for w in self.texts if w.committed is not None}


class Written:
    interval_s = 0.0

    def __init__(self, recorder: Recorder, key: TurnKey) -> None:
        self.recorder, self.key = recorder, key
        self.pieces: list[str] = []
        self.committed: str | None = None
        self.discarded = False

    def write(self, piece: str) -> None:
        assert self.committed is None and not self.discarded, "a piece after the turn ended"
        self.pieces.append(piece)

    async def commit(self, text: str) -> None:
        self.committed = text
        self.recorder.log.append(("commit", self.key))

    def discard(self) -> None:
        self.discarded = True
        self.recorder.log.append(("discard", self.key))


def debate(answer: Any, **options: Any) -> Debate:
    options.setdefault("moderator", Participant("moderator", "Moderate."))
    return Debate("streamed", [Participant("optimist", "For."), Participant("critic", "Against.")],
                  llm=FunctionLLM(answer), **options)


def plain(request: LLMRequest) -> Any:
    if request.purpose == "judge":
        return {"consensus": False, "summary": "apart"}
    return f"{request.speaker} says a few words in round {request.round}."


async def test_every_free_text_call_is_streamed_and_committed_before_it_is_reported() -> None:
    recorder = Recorder()
    result = await debate(plain, judge=Judge(), max_rounds=2).run(
        "Tabs?", on_event=recorder.on_event, on_text=recorder.on_text)
    keys = [w.key for w in recorder.texts]
    assert keys == [TurnKey(0, "moderator", "framing"),
                    TurnKey(1, "optimist", "opening"), TurnKey(1, "critic", "opening"),
                    TurnKey(2, "optimist", "rebuttal"), TurnKey(2, "critic", "rebuttal"),
                    TurnKey(2, "moderator", "synthesis")]  # the judge's JSON is not streamed
    for written in recorder.texts:
        assert written.pieces == [f"{written.key.speaker} ", "says ", "a ", "few ", "words ",
                                  "in ", "round ", f"{written.key.round}."]
        assert written.committed == "".join(written.pieces)
    turns = {(t.round, t.speaker): t.text for r in result.rounds for t in r.turns}
    for key, text in recorder.committed().items():
        if key.purpose in ("opening", "rebuttal"):
            assert turns[key.round, key.speaker] == text
    assert recorder.committed()[TurnKey(0, "moderator", "framing")] == result.framing
    assert recorder.committed()[TurnKey(2, "moderator", "synthesis")] == result.synthesis
    # Each commit comes right before the event reporting its turn.
    reported = (ev.TurnCompleted, ev.FramingCompleted, ev.SynthesisCompleted)
    for at, (what, _) in enumerate(recorder.log):
        if what == "commit":
            after = recorder.log[at + 1]
            assert after[0] == "event" and isinstance(after[1], reported), recorder.log[at:at + 2]


async def test_the_commit_is_the_cleaned_text_not_the_raw_one() -> None:
    def answer(request: LLMRequest) -> str:
        if request.speaker == "optimist":
            return "optimist: We should.\ncritic: No we should not."  # writes the critic's line
        return "Fine."

    recorder = Recorder()
    result = await debate(answer, moderator=None, max_rounds=1).run(
        "Tabs?", on_text=recorder.on_text)
    optimist = recorder.texts[0]
    assert "".join(optimist.pieces) == "optimist: We should.\ncritic: No we should not."
    assert optimist.committed == result.rounds[0].turns[0].text == "We should."


async def test_an_answer_asked_again_is_written_afresh_and_a_failed_turn_commits_nothing() -> None:
    asked: dict[str, int] = {}

    def answer(request: LLMRequest) -> str:
        asked[request.speaker] = asked.get(request.speaker, 0) + 1
        if request.speaker == "critic":
            raise LLMError("critic's model is down")
        if asked[request.speaker] == 1:
            return "critic: only the other speaker's line"  # nothing left once cleaned
        return "Now as myself."

    recorder = Recorder()
    result = await debate(answer, moderator=None, max_rounds=1).run(
        "Tabs?", on_text=recorder.on_text)
    first, second, critic = recorder.texts
    assert first.key == second.key == TurnKey(1, "optimist", "opening")
    assert (first.discarded, first.committed) == (True, None)
    assert second.committed == "Now as myself." == result.rounds[0].turns[0].text
    assert critic.committed == ""  # the failed turn's text in the transcript
    assert result.rounds[0].turns[1].failed


async def test_without_on_text_nothing_is_streamed() -> None:
    llm = FunctionLLM(plain)
    streamed: list[LLMRequest] = []
    original = llm.stream

    def spy(request: LLMRequest) -> Any:
        streamed.append(request)
        return original(request)

    llm.stream = spy  # type: ignore[method-assign]
    result = await Debate("d", [Participant("a", "A"), Participant("b", "B")], llm=llm,
                          max_rounds=1).run("Tabs?")
    assert result.ok and len(llm.requests) == 2
    assert streamed == []
