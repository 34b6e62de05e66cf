"""Prompts: overrides (templates and callables), word limits, and topics that are only data."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies
import pytest

from debatebus import Debate, Judge, Participant
from debatebus.engine import PROTOCOL_VERSION, DebateState, PromptContext, Prompts, Utility
from debatebus.engine._definition import fixed_fields
from debatebus.engine._run import Run
from debatebus.engine._templates import bind_template, fill_parts, fill_template, template_fields
from debatebus.engine._transcript import Round, TranscriptText, Turn, render_round
from debatebus.exceptions import ConfigError
from debatebus.testing import FunctionLLM

NAMES = ("alice", "bob")
NASTY_TOPIC = "Summarize {input} and {{ x }} then {0} {question} {} {{{speaker}}} }{ %s $x"


def people() -> list[Participant]:
    return [Participant(n, f"You are {n}.") for n in NAMES]


async def test_a_topic_with_template_syntax_reaches_every_prompt_unchanged(make_stage):
    stage = make_stage()
    d = Debate(
        "nasty",
        people(),
        llm=stage.llm,
        moderator=Participant("moderator", "M"),
        judge=Judge(),
        max_rounds=2,
    )
    result = await d.run(NASTY_TOPIC)

    assert result.status == "completed"
    assert result.question == NASTY_TOPIC
    assert {r.purpose for r in stage.requests} == {
        "framing",
        "opening",
        "rebuttal",
        "judge",
        "synthesis",
    }
    for request in stage.requests:
        assert NASTY_TOPIC in request.prompt, request.purpose


async def test_a_topic_with_template_syntax_in_cross_pollination(make_stage):
    stage = make_stage()
    d = Debate(
        "nasty-x",
        people(),
        llm=stage.llm,
        protocol="cross-pollination",
        moderator=Participant("moderator", "M"),
        audience="{audience} readers",
    )
    await d.run(NASTY_TOPIC)

    purposes = {r.purpose for r in stage.requests}
    assert purposes == {"framing", "audience", "position", "revision", "synthesis"}
    for request in stage.requests:
        assert NASTY_TOPIC in request.prompt, request.purpose
    assert "Audience: {audience} readers" in stage.prompt_of("moderator", "audience", 0)


async def test_answers_with_braces_pass_through_to_later_prompts(make_stage):
    stage = make_stage(replies={("alice", "opening", 1): "use {question} and {{ y }}"})
    d = Debate("braces", people(), llm=stage.llm, moderator=Participant("moderator", "M"))
    await d.run("plain topic", max_rounds=1)
    assert "alice said:\n> use {question} and {{ y }}" in stage.prompt_of("bob", "opening", 1)
    assert "alice said:\n> use {question} and {{ y }}" in stage.prompt_of("moderator", "synthesis", 1)


async def test_a_topic_with_braces_in_a_custom_template(make_stage):
    stage = make_stage()
    prompts = Prompts(opening="{{literal}} {speaker} on <{question}>")
    await Debate("t", people(), llm=stage.llm, prompts=prompts).run("{input}", max_rounds=1)
    assert stage.prompt_of("alice", "opening", 1) == "{literal} alice on <{input}>"


async def test_string_template_overrides_with_every_documented_field(make_stage):
    stage = make_stage()
    template = (
        "{debate_name}|{speaker}|{round}|{participants}|{question}|{framing}|{word_limit}|{transcript}"
    )
    d = Debate(
        "fields",
        people(),
        llm=stage.llm,
        moderator=Participant("moderator", "M"),
        prompts=Prompts(rebuttal=template),
        word_limits={"rebuttal": 30},
        max_rounds=2,
    )
    await d.run("T")

    assert stage.prompt_of("bob", "rebuttal", 2) == (
        "fields|bob|2|alice, bob|T|Framing: moderator framing 0\n| Answer in at most 30 words.|"
        "Round 1:\nalice said:\n> alice opening 1\nbob said:\n> bob opening 1\n\n"
        "Round 2:\nalice said:\n> alice rebuttal 2"
    )
    # The other prompts keep the shipped defaults.
    assert "give your opening position" in stage.prompt_of("alice", "opening", 1)


async def test_callable_prompts_receive_the_context_and_debate_state(make_stage):
    stage = make_stage(consensus_at=None)
    contexts: list[PromptContext] = []

    def rebuttal(ctx: PromptContext) -> str:
        contexts.append(ctx)
        return f"callable for {ctx.speaker} after {len(ctx.state.rounds)} rounds"

    def judge(ctx: PromptContext) -> str:
        contexts.append(ctx)
        return f"judge round {ctx.state.round}"

    d = Debate(
        "callables",
        people(),
        llm=stage.llm,
        moderator=Participant("moderator", "M"),
        judge=Judge(),
        prompts=Prompts(rebuttal=rebuttal, judge=judge),
        max_rounds=3,
    )
    await d.run("T", debate_id="dc")

    assert stage.prompt_of("alice", "rebuttal", 2) == "callable for alice after 1 rounds"
    assert stage.prompt_of("bob", "rebuttal", 3) == "callable for bob after 2 rounds"
    assert stage.prompt_of("judge", "judge", 3) == "judge round 3"
    states = [c.state for c in contexts]
    assert all(isinstance(s, DebateState) for s in states)
    assert all(s.debate_id == "dc" and s.question == "T" for s in states)
    assert all(s.framing == "moderator framing 0" for s in states)
    bob_round_3 = next(c for c in contexts if c.speaker == "bob" and c.round == 3)
    assert bob_round_3.state.verdict.summary == "after round 2"
    assert bob_round_3.transcript.endswith("Round 3:\nalice said:\n> alice rebuttal 3")
    assert bob_round_3.participants == "alice, bob"
    assert "opening" in stage.prompt_of("alice", "opening", 1)  # still the shipped template


async def test_cross_pollination_templates_can_use_utility_fields(make_stage):
    stage = make_stage()
    participants = [
        Participant("alice", "A", utility=Utility("speed", "cost")),
        Participant("bob", "B", utility=Utility("safety", "risk")),
    ]
    prompts = Prompts(
        position="{speaker} max={maximizes} pen={penalizes}{word_limit}",
        revision="{speaker} sees:\n{positions}",
        synthesis="{audience}{positions}",
    )
    d = Debate("u", participants, llm=stage.llm, protocol="cross-pollination", prompts=prompts)
    await d.run("T")

    assert stage.prompt_of("alice", "position", 1) == (
        "alice max=speed pen=cost Answer in at most 60 words."
    )
    assert stage.prompt_of("alice", "revision", 2) == (
        "alice sees:\n[bob] You maximize: safety. You penalize: risk. bob position 1"
    )
    assert stage.prompt_of("synthesis", "synthesis", 2) == (
        "[alice] You maximize: speed. You penalize: cost. alice revision 2\n"
        "[bob] You maximize: safety. You penalize: risk. bob revision 2"
    )


async def test_round_robin_word_limits_apply_per_phase(make_stage):
    stage = make_stage()
    d = Debate(
        "limits",
        people(),
        llm=stage.llm,
        moderator=Participant("moderator", "M"),
        word_limits={"opening": 40, "synthesis": 200},
        max_rounds=2,
    )
    await d.run("T")
    assert " Answer in at most 40 words." in stage.prompt_of("alice", "opening", 1)
    assert "Answer in at most" not in stage.prompt_of("alice", "rebuttal", 2)
    assert stage.prompt_of("moderator", "synthesis", 2).endswith(" Answer in at most 200 words.")


async def test_round_robin_has_no_default_word_limits(make_stage):
    stage = make_stage()
    await Debate("limits", people(), llm=stage.llm, max_rounds=1).run("T")
    assert all("Answer in at most" not in r.prompt for r in stage.requests)


def test_protocol_version_is_a_constant_string():
    assert isinstance(PROTOCOL_VERSION, str)
    assert PROTOCOL_VERSION


async def test_every_prompt_can_be_overridden(make_stage):
    stage = make_stage()
    names = ("opening", "rebuttal", "judge", "synthesis", "framing")
    prompts = Prompts(**{name: name + " {question}" for name in names})
    d = Debate(
        "all",
        people(),
        llm=stage.llm,
        moderator=Participant("moderator", "M"),
        judge=Judge(),
        prompts=prompts,
        max_rounds=2,
    )
    await d.run("T")
    assert {(r.purpose, r.prompt) for r in stage.requests} == {(n, f"{n} T") for n in names}

    stage = make_stage()
    names = ("audience", "position", "revision", "synthesis")
    prompts = Prompts(**{name: name + " {question}" for name in names})
    d = Debate(
        "all-x",
        people(),
        llm=stage.llm,
        protocol="cross-pollination",
        audience="A",
        prompts=prompts,
    )
    await d.run("T")
    assert {(r.purpose, r.prompt) for r in stage.requests} == {(n, f"{n} T") for n in names}


@hypothesis.given(hypothesis.strategies.lists(hypothesis.strategies.sampled_from(
    ["a", "b c", " ", "\t", ">", "\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85",
     "\u2028", "\u2029", "é"]),
    max_size=20).map("".join))
def test_a_turn_is_quoted_line_by_line_whatever_its_line_breaks(text: str) -> None:
    rendered = render_round(Round(number=1, turns=[Turn(speaker="ann", round=1, text=text)]))
    lines = text.strip().splitlines()
    quoted = "\n".join(f"> {line}" for line in lines)
    assert rendered == ("Round 1:\n" + (f"ann said:\n{quoted}" if lines else "ann said nothing."))


_FIELDS = {"question": "Q?", "round": 2, "transcript": "x {y} z", "persona": "", "flag": True}


@hypothesis.given(hypothesis.strategies.lists(hypothesis.strategies.sampled_from(
    ["text ", "{{", "}}", "\n", "{question}", "{round}", "{transcript}", "{persona}", "{flag}",
     "{round:03d}", "{question!r}", "{question.upper}", "{transcript[0]}", "{}", "{0}"]),
    max_size=12).map("".join))
def test_a_template_is_filled_as_format_map_fills_it(template: str) -> None:
    """Plain fields are filled from the template's parsed parts, the others by format_map:
    either way the prompt is format_map's."""
    try:
        expected = template.format_map(_FIELDS)
    except (KeyError, IndexError, ValueError):
        with pytest.raises(ConfigError, match="not a known field"):
            fill_template(template, _FIELDS)
        return
    assert fill_template(template, _FIELDS) == expected


@pytest.mark.parametrize("template", ["{speaker} says", "{round:02d} {speaker}", "{ {speaker}"])
def test_a_template_naming_an_unknown_field_says_which(template: str) -> None:
    with pytest.raises(ConfigError, match="not a known field"):
        fill_template(template, _FIELDS)


@hypothesis.given(
    hypothesis.strategies.lists(hypothesis.strategies.sampled_from(
        ["text ", "{{", "}}", "\n", "{question}", "{round}", "{transcript}", "{persona}", "{flag}",
         "{round:03d}"]), max_size=12).map("".join),
    hypothesis.strategies.sets(hypothesis.strategies.sampled_from(["question", "persona"])))
def test_a_template_bound_to_some_fields_fills_as_format_map_fills_it(template: str,
                                                                    fixed: set[str]) -> None:
    """Fields filled once (``bind_template``) and the rest per call (``fill_parts``): the prompt is
    format_map's; a template that is not plain is left to ``fill_template``."""
    parts = bind_template(template, {name: str(_FIELDS[name]) for name in fixed})
    if "{round:03d}" in template:
        assert parts is None
        return
    assert parts is not None
    text, breaks = fill_parts(parts, _FIELDS, template)
    assert text == template.format_map(_FIELDS)
    assert list(breaks) == sorted(set(breaks)) and all(0 < b <= len(text) for b in breaks)


@pytest.mark.parametrize("protocol", ["round-robin", "cross-pollination"])
@pytest.mark.parametrize("language", ["en", "es"])
def test_every_shipped_prompt_is_the_same_bound_or_filled_whole(protocol: str,
                                                                language: str) -> None:
    debate = Debate("d", [Participant("ann", "Argue for."), Participant("bob", "Argue against.")],
                    llm=FunctionLLM(lambda request: "ok"), moderator=Participant("mod", "Moderate."),
                    judge=Judge(), protocol=protocol, language=language,
                    word_limits={"opening": 40, "synthesis": 90})
    spec = debate.spec
    run = Run(spec, "Q {x}?", "d1")
    assert spec.bound_templates  # the shipped templates are plain: every one is bound
    for (phase, speaker), _ in spec.bound_templates.items():
        whole = fill_template(getattr(spec.templates, phase), {
            **template_fields(question="Q {x}?", framing="", round=2, transcript="T {y}"),
            **fixed_fields(spec, phase, speaker)})
        assert run.prompt(phase, speaker, 2, TranscriptText("T {y}")).content == whole
