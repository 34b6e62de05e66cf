"""Clean turns: stop sequences at other speakers' tags, turns cut where another turn starts, word
limits as token budgets. Scripted answers are the embedded model's real failures (issue 13)."""

from __future__ import annotations

import re

import hypothesis
import hypothesis.strategies as st

from debatebus import Debate, Judge, Participant
from debatebus.engine._transcript import _heading, _maybe_tagged, _turn_start, clean_turn, fit_words
from debatebus.llm._fakes import word_usage
from debatebus.testing import ScriptedLLM

TOPIC = "Should a 5-person startup adopt microservices?"
NAMES = ("optimist", "critic", "pragmatist")
EVERYONE = (*NAMES, "moderator", "judge")

# Real answers of SmolLM2-135M under the protocol-1 prompts.
REWRITTEN = (
    "Microservices let a small team ship parts independently.\n"
    "Here's a rewritten version of the debate with some suggestions for improvement:\n"
    "Round 1: [optimist] Microservices are the future.\n[critic]: They are not."
)
INVENTED = (
    "[critic]: A five-person team cannot run twenty services.\n"
    "[adversary]: But what about scaling?\n[expert] Both of you are right."
)
NAMED = "Start with a monolith and split it later.\noptimist: I agree with that completely."
ROUND = "Keep one deployable.\n**Round 2:**\ncritic said: fine."


def people() -> list[Participant]:
    return [Participant(n, f"You are the {n}.") for n in NAMES]


def verdict(text: str) -> dict[str, object]:
    return {"consensus": False, "summary": text}


async def test_impersonated_and_invented_turns_are_cut_from_the_transcript() -> None:
    llm = ScriptedLLM(
        ["Framing.", REWRITTEN, INVENTED, NAMED, verdict("split"), "Synthesis.\n[judge]: done"]
    )
    d = Debate(
        "clean",
        people(),
        llm=llm,
        moderator=Participant("moderator", "M"),
        judge=Judge(),
        max_rounds=1,
    )
    result = await d.run(TOPIC)

    assert [t.text for t in result.rounds[0].turns] == [
        "Microservices let a small team ship parts independently.",
        "A five-person team cannot run twenty services.",
        "Start with a monolith and split it later.",
    ]
    assert result.synthesis == "Synthesis."
    judge_prompt = llm.requests[4].prompt
    for tag in ("[adversary]", "[expert]", "rewritten version", "optimist:", "[critic]"):
        assert tag not in judge_prompt


async def test_free_text_calls_stop_at_every_other_speaker_s_tag_and_verdicts_do_not() -> None:
    llm = ScriptedLLM(["Framing.", "a", "b", "c", verdict("v")])
    d = Debate(
        "stops",
        people(),
        llm=llm,
        moderator=Participant("moderator", "M"),
        judge=Judge(),
        max_rounds=1,
    )
    await d.run(TOPIC)

    critic = next(r for r in llm.requests if r.speaker == "critic")
    for name in set(EVERYONE) - {"critic"}:
        assert f"[{name}]" in critic.stop
        assert f"\n{name}:" in critic.stop
    assert not any("critic" in stop for stop in critic.stop)
    (judge,) = [r for r in llm.requests if r.purpose == "judge"]
    assert judge.stop == ()  # a stop string inside the JSON would cut the verdict short


async def test_a_word_limit_sets_the_token_budget_and_trims_the_turn() -> None:
    long_turn = "One short sentence here. " + "word " * 40
    llm = ScriptedLLM([long_turn, "Fine.", "Also fine."])
    d = Debate("limits", people(), llm=llm, word_limits={"opening": 10}, max_rounds=1)
    result = await d.run(TOPIC)

    assert all(r.max_tokens is not None and r.max_tokens >= 10 for r in llm.requests)
    assert result.rounds[0].turns[0].text == (
        "One short sentence here. word word word word word word…"
    )
    assert len(result.rounds[0].turns[0].text.split()) <= 10
    assert result.rounds[0].turns[1].text == "Fine."


def test_clean_turn_keeps_an_answer_with_nothing_to_cut_unchanged() -> None:
    text = "  Costs [1] matter; the critic: has a point mid-line.\n"
    assert clean_turn(text, "optimist", EVERYONE) == text
    assert clean_turn("[optimist]: Mine.", "optimist", EVERYONE) == "Mine."
    assert clean_turn(ROUND, "pragmatist", EVERYONE) == "Keep one deployable."


@hypothesis.given(st.lists(st.sampled_from(
    ["a", "critic", "optimist", " said", ":", "[", "]", "x", "\n", " ", "round", "ROUND", "Round",
     "*", "2", ">", "-", "\t"]), max_size=16).map("".join))
def test_a_text_the_screen_passes_over_matches_no_pattern(text: str) -> None:
    """clean_turn keeps a text as it is unless it holds ``[``, ``:`` or "round" in any case: no
    heading or turn start can be in such a text."""
    if not _maybe_tagged(text):
        assert _heading("optimist").match(text) is None
        assert _turn_start(NAMES).search(text) is None
        assert clean_turn(text, "optimist", NAMES) == text


@hypothesis.given(st.lists(st.sampled_from(
    ["a", "critic", "Critic", "pragmatist", " said", ":", "[x]", "[", "]", "\n", " ", "\t", "> ",
     "round 2", "ROUND 3:", "**", "-", "\r"]), max_size=20).map("".join))
def test_a_turn_start_is_found_where_a_multiline_caret_finds_it(text: str) -> None:
    """The turn-start pattern searches "\n" + text with the "\n" as its first character: it
    finds what the same pattern with ``^`` under MULTILINE finds in the text, at the same index."""
    pattern = _turn_start(("critic", "pragmatist"))
    assert pattern.pattern.startswith("\\n")
    caret = re.compile("^" + pattern.pattern[2:], pattern.flags | re.MULTILINE)
    found, expected = pattern.search("\n" + text), caret.search(text)
    assert (found and found.start()) == (expected and expected.start())


def test_a_heading_of_the_speaker_s_own_is_dropped_not_taken_for_another_turn() -> None:
    # Real: the critic's opening began "Round 2:\n…", which cut the whole turn away.
    assert clean_turn("Round 2:\nA risk. Another.", "critic", EVERYONE) == "A risk. Another."
    assert clean_turn("[Critic's view]\nCosts.\n[optimist]: no", "critic", EVERYONE) == "Costs."
    assert clean_turn("**Round 1:** [critic]: Mine.", "critic", EVERYONE) == "Mine."
    assert clean_turn("[optimist]: Not mine.", "critic", EVERYONE) == ""


def test_fit_words_prefers_a_sentence_end() -> None:
    assert fit_words("One two three. Four five six seven. Eight nine ten", 9) == (
        "One two three. Four five six seven."
    )
    assert fit_words("a b c", None) == "a b c"


# The embedded model's answer that left nothing once cleaned (benchmarks/local_quality.py counted
# these as empty turns): all of it another speaker's turn.
ALL_OTHERS = "[critic]: Microservices are a trap.\n[pragmatist] Agreed."


async def test_an_answer_that_was_all_another_speaker_s_turn_is_asked_for_once_more() -> None:
    llm = ScriptedLLM(["Framing.", ALL_OTHERS, "Ship one service first.", "Too early.",
                       "Split later.", verdict("split"), "Synthesis."])
    d = Debate("clean", people(), llm=llm, moderator=Participant("moderator", "M"),
               judge=Judge(), max_rounds=1)
    result = await d.run(TOPIC)

    optimist, critic, pragmatist = result.rounds[0].turns
    assert (optimist.text, critic.text, pragmatist.text) == (
        "Ship one service first.", "Too early.", "Split later.")
    assert llm.requests[1].prompt == llm.requests[2].prompt  # the same question, asked again
    assert result.calls == 7
    # The turn's usage is what both of its calls spent.
    asked = llm.requests[1]
    assert optimist.usage == word_usage(asked, ALL_OTHERS) + word_usage(asked, optimist.text)


async def test_a_second_answer_that_is_all_another_speaker_s_turn_too_is_left_empty() -> None:
    llm = ScriptedLLM(["Framing.", ALL_OTHERS, ALL_OTHERS, "Too early.", "Split later.",
                       verdict("split"), "Synthesis."])
    d = Debate("clean", people(), llm=llm, moderator=Participant("moderator", "M"),
               judge=Judge(), max_rounds=1)
    result = await d.run(TOPIC)

    assert [t.text for t in result.rounds[0].turns] == ["", "Too early.", "Split later."]
    assert result.calls == 7  # asked twice, not more
