"""Prompts keep what a debate's calls share first, and mark where it ends (their ``breaks``), so a
provider's prompt cache reuses it: later turns read what earlier turns wrote.

Checked for every shipped protocol, language and preset: the prefix a call marks as shared holds
nothing of its speaker's own (persona, turn line), and every turn, judge and synthesis call after
the first finds an earlier call's whole shared prefix (same system prompt) ending at one of its
own breaks."""

from __future__ import annotations

from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest

from debatebus import Debate, Judge, Participant
from debatebus.engine import Prompts, Utility
from debatebus.engine._presets import PRESETS
from debatebus.engine._run import Run
from debatebus.engine._transcript import (
    Round,
    TranscriptText,
    Turn,
    render_round,
    render_transcript,
)
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM

QUESTION = "Should the library adopt {templates} for its prompts?"
#: How each language opens a speaker's own part of a prompt.
TURN_LINE = {"en": "Now it is {}'s turn", "es": "Ahora es el turno de {}"}
#: Calls that must read an earlier call's prefix, once one was written. (Cross-pollination's
#: judge and synthesis see the revisions in a layout of their own, once each.)
READERS = {"round-robin": {"opening", "rebuttal", "judge", "synthesis"},
           "cross-pollination": {"position", "revision"}}


def _answer(request: LLMRequest) -> Any:
    if request.response_schema is not None:
        return {"consensus": False, "summary": f"Still apart after round {request.round}."}
    return (f"{request.speaker} holds that point {request.round} matters more than the rest, "
            "and explains why with an example.")


def _debate(protocol: str, language: str, preset: str | None, llm: FunctionLLM) -> Debate:
    if preset is not None:
        return Debate.from_preset(preset, llm=llm, language=language, judge=Judge())
    participants = [
        Participant(name, f"You argue as {name}, who weighs {topic}.",
                    utility=Utility(maximizes=topic, penalizes="waste"))
        for name, topic in (("ann", "speed"), ("bob", "cost"), ("cyd", "safety"))]
    return Debate("prefixes", participants, llm=llm, protocol=protocol, language=language,
                  moderator=Participant("mod", "You moderate with care."), judge=Judge(),
                  max_rounds=3, audience="city officials" if protocol != "round-robin" else None)


CASES = [(protocol, language, None) for protocol in ("round-robin", "cross-pollination")
         for language in TURN_LINE] + [
    (None, language, name) for name in PRESETS for language in TURN_LINE]


def _shared(request: LLMRequest) -> str:
    [message] = request.messages
    return message.content[: message.breaks[-1]]


@pytest.mark.parametrize(("protocol", "language", "preset"), CASES)
async def test_what_varies_per_speaker_comes_after_the_shared_prefix(
        protocol: str | None, language: str, preset: str | None) -> None:
    llm = FunctionLLM(_answer)
    debate = _debate(protocol or "round-robin", language, preset, llm)
    result = await debate.run(QUESTION, debate_id="d-1")
    assert result.ok, result.error
    personas = debate.spec.personas
    readers_of = READERS[debate.protocol]
    seen: dict[str, set[str]] = {}  # system prompt → shared prefixes readers wrote so far
    readers = 0
    for request in llm.requests:
        [message] = request.messages
        assert message.breaks, request.purpose
        assert list(message.breaks) == sorted(set(message.breaks))
        assert message.breaks[0] > 0 and message.breaks[-1] <= len(message.content)
        shared = _shared(request)
        # Nothing of the speaker's own before the end of the shared prefix.
        assert personas[request.speaker] not in request.system + shared, request.purpose
        assert TURN_LINE[language].format(request.speaker) not in shared, request.purpose
        if request.purpose not in readers_of:
            continue
        written = seen.setdefault(request.system, set())
        if written:
            # It reads what an earlier call wrote: that call's whole shared prefix ends at one
            # of this call's breaks.
            ends = {message.content[:b] for b in message.breaks}
            assert ends & written, (request.speaker, request.purpose, request.round)
            readers += 1
        written.add(shared)
    assert readers >= len(llm.requests) // 2


async def test_the_judge_reads_the_debaters_prefix() -> None:
    """Its JSON instructions close its prompt: its system prompt and transcript are the
    debaters', so the judge after a round reads the prefix its last speaker wrote."""
    llm = FunctionLLM(_answer)
    debate = _debate("round-robin", "en", None, llm)
    assert (await debate.run(QUESTION)).ok
    requests = llm.requests
    for index, request in enumerate(requests):
        if request.purpose != "judge":
            continue
        last_turn = requests[index - 1]
        assert last_turn.purpose in ("opening", "rebuttal")
        assert request.system == last_turn.system
        [message] = request.messages
        assert _shared(last_turn) in {message.content[:b] for b in message.breaks}


def test_a_custom_template_shares_its_prefix_up_to_its_first_own_field() -> None:
    """Before ``{speaker}``: shared; the transcript after it is then the speaker's own too."""
    debate = Debate("custom", [Participant("ann", "A."), Participant("bob", "B.")],
                    llm=FunctionLLM(_answer),
                    prompts=Prompts(opening="About {question}, {speaker}: {transcript}"))
    message = Run(debate.spec, "tabs", "d-1").prompt(
        "opening", "ann", 1, TranscriptText("T1 T2", (2, 5)))
    assert message.content == "About tabs, ann: T1 T2"
    assert message.breaks == (len("About tabs, "),)


_turns = st.lists(st.builds(
    Turn, speaker=st.sampled_from(["ann", "bob"]), round=st.just(1),
    text=st.text(alphabet="ab \n>", max_size=12), failed=st.booleans()), max_size=4)


@hypothesis.given(st.lists(_turns, max_size=3), _turns)
def test_the_transcript_and_its_breaks(rounds_turns: list[list[Turn]], current: list[Turn]) -> None:
    """The text is the rounds' renderings joined by blank lines, as every prompt had it; a break
    ends every turn shown, and only there."""
    rounds = [Round(number=n, turns=turns) for n, turns in enumerate(rounds_turns, 1)]
    pending = Round(number=len(rounds) + 1, turns=current)
    rendered = render_transcript(rounds, pending.number, current)
    shown = [*rounds, pending] if current else rounds
    assert rendered.text == "\n\n".join(render_round(r) for r in shown)
    ends = []
    for index in range(len(shown)):
        before = "\n\n".join(render_round(r) for r in shown[:index])
        head = len(before) + (2 if index else 0) + len(f"Round {shown[index].number}:\n")
        for turn in (t for t in shown[index].turns if not t.failed):
            text = render_round(Round(number=0, turns=[turn])).removeprefix("Round 0:\n")
            head += len(text)
            ends.append(head)
            head += 1
    assert list(rendered.breaks) == ends
