"""Every ConfigError the constructor (and ``run``) raises, and that its message says what to fix."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
from pydantic import BaseModel

from debatebus import Debate, DebatebusError, Judge, Participant
from debatebus.engine import Prompts
from debatebus.engine._definition import FAILURE_POLICIES, PROTOCOLS, DebateSpec
from debatebus.exceptions import ConfigError
from debatebus.testing import ScriptedLLM


def llm() -> ScriptedLLM:
    return ScriptedLLM([])


def two() -> list[Participant]:
    return [Participant("alice", "A"), Participant("bob", "B")]


def own_llms() -> list[Participant]:
    return [Participant("alice", "A", llm=llm()), Participant("bob", "B", llm=llm())]


class Ruling(BaseModel):
    summary: str


class LooseVerdict(BaseModel):
    consensus: str
    summary: str


def test_config_error_is_a_value_error_and_a_debatebus_error():
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, DebatebusError)
    with pytest.raises(ValueError, match="no participants"):
        Debate("d", [], llm=llm())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"participants": []}, "Debate 'd' has no participants: pass at least one Participant"),
        (
            {"participants": [*two(), Participant("bob", "again")]},
            "duplicate participant names ['bob']: give each participant a unique name",
        ),
        ({"max_rounds": 0}, "max_rounds must be an integer ≥ 1, got 0"),
        ({"max_rounds": -2}, "max_rounds must be an integer ≥ 1, got -2"),
        (
            {"transcript_window": 0},
            "transcript_window must be ≥ 1 (or None for the whole transcript), got 0",
        ),
        (
            {"protocol": "ring"},
            "unknown protocol 'ring': use one of ['round-robin', 'cross-pollination']",
        ),
        (
            {"failure_policy": "lenient"},
            "unknown failure_policy 'lenient': use one of ['degrade', 'strict']",
        ),
        (
            {"protocol": "cross-pollination", "participants": [Participant("alice", "A")]},
            "cross-pollination needs at least 2 participants",
        ),
        ({"deadline_s": 0}, "deadline_s must be > 0 seconds, got 0"),
        ({"name": ""}, "Debate needs a non-empty name"),
    ],
)
def test_invalid_shapes(kwargs, message):
    options = {"name": "d", "participants": two(), "llm": llm(), **kwargs}
    with pytest.raises(ConfigError, match=re.escape(message)):
        Debate(options.pop("name"), options.pop("participants"), **options)


def test_participant_without_llm_and_no_default():
    participants = [Participant("alice", "A", llm=llm()), Participant("bob", "B")]
    with pytest.raises(ConfigError) as caught:
        Debate("d", participants)
    assert str(caught.value) == (
        "participant 'bob' has no LLM and the debate has no default: pass llm=… to it or to Debate"
    )


@pytest.mark.parametrize(
    ("role", "value"),
    [
        ("moderator", Participant("mod", "M")),
        ("judge", Judge()),
        ("synthesizer", Participant("writer", "W")),
    ],
)
def test_role_without_llm_and_no_default(role, value):
    with pytest.raises(ConfigError, match=rf"^{role} has no LLM .* pass llm=… to it or to Debate"):
        Debate("d", own_llms(), **{role: value})


def test_roles_with_their_own_llm_need_no_default():
    d = Debate(
        "d",
        own_llms(),
        moderator=Participant("mod", "M", llm=llm()),
        judge=Judge(llm=llm()),
        synthesizer=Participant("writer", "W", llm=llm()),
    )
    assert d.name == "d"


def test_cross_pollination_needs_someone_to_synthesize():
    with pytest.raises(ConfigError, match="pass synthesizer=…, moderator=… or a default llm=…"):
        Debate("d", own_llms(), protocol="cross-pollination")
    Debate(
        "d", own_llms(), protocol="cross-pollination", synthesizer=Participant("w", "W", llm=llm())
    )


@pytest.mark.parametrize("schema", [Ruling, LooseVerdict])
def test_judge_schema_needs_a_consensus_bool_without_until(schema):
    with pytest.raises(ConfigError) as caught:
        Debate("d", two(), llm=llm(), judge=Judge(schema=schema))
    message = str(caught.value)
    assert f"judge schema {schema.__name__} has no `consensus: bool` field" in message
    assert "add that field or pass until=…" in message


@pytest.mark.parametrize("schema", [Ruling, LooseVerdict])
def test_judge_schema_without_consensus_is_accepted_with_until(schema):
    d = Debate("d", two(), llm=llm(), judge=Judge(schema=schema), until=lambda state: True)
    assert d.spec.judge is not None
    assert d.spec.judge.schema is schema


def test_judge_schema_must_be_a_pydantic_model():
    with pytest.raises(ConfigError, match="Judge schema must be a pydantic model class"):
        Debate("d", two(), llm=llm(), judge=Judge(schema=dict), until=lambda s: True)  # type: ignore[arg-type]


def test_prompt_template_with_an_unknown_field_fails_at_construction():
    with pytest.raises(ConfigError) as caught:
        Debate("d", two(), llm=llm(), prompts=Prompts(opening="Argue {side} of {topic}"))
    message = str(caught.value)
    assert "'side'" in message
    assert "not a known field" in message
    assert "'question'" in message  # lists the fields that can be used
    assert "double braces for literal ones" in message


def test_prompt_that_is_neither_a_template_nor_callable_fails_at_construction():
    message = "prompt 'opening' must be a str.format template or a callable"
    with pytest.raises(ConfigError, match=re.escape(message)):
        Debate("d", two(), llm=llm(), prompts=Prompts(opening=42))  # type: ignore[arg-type]


async def test_run_rejects_a_non_string_question_and_a_bad_round_cap():
    d = Debate("d", two(), llm=llm())
    with pytest.raises(ConfigError, match="the question must be a string, got int"):
        await d.run(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_rounds must be ≥ 1, got 0"):
        await d.run("topic", max_rounds=0)


def test_a_valid_debate_is_immutable_and_named():
    d = Debate("d", two(), llm=llm(), protocol="cross-pollination")
    assert repr(d) == "Debate('d', ['alice', 'bob'], protocol='cross-pollination')"
    with pytest.raises(AttributeError):
        d.spec.max_rounds = 9  # type: ignore[misc]
    assert d.name == "d"
    assert d != Debate("d", two(), llm=llm(), protocol="cross-pollination")  # compared by identity


def test_debate_arguments_are_the_spec_fields_and_the_literals_type_them():
    params = inspect.signature(Debate).parameters
    assert list(params) == [f.name for f in dataclasses.fields(DebateSpec) if f.init]
    assert params["protocol"].annotation == "Protocol"
    assert params["failure_policy"].annotation == "FailurePolicy"
    assert PROTOCOLS == ("round-robin", "cross-pollination")
    assert FAILURE_POLICIES == ("degrade", "strict")


def test_drift_belongs_to_the_handler_not_the_debate():
    with pytest.raises(TypeError, match="drift"):
        Debate("d", two(), llm=llm(), drift="loose")  # type: ignore[call-arg]
    assert Debate("d", two(), llm=llm()).as_handler(drift="loose") is not None
    with pytest.raises(ConfigError, match="unknown drift 'lax': use 'strict' or 'loose'"):
        Debate("d", two(), llm=llm()).as_handler(drift="lax")  # type: ignore[arg-type]
