"""What a debate is: participants, roles, protocol and limits, validated once at construction."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from debatebus.engine.prompts import (
    CROSS_POLLINATION_PROMPTS,
    DEFAULT_PROMPTS,
    Prompts,
    validate_template,
    word_limit_text,
)
from debatebus.exceptions import ConfigError
from debatebus.llm.base import LLM

if TYPE_CHECKING:
    from debatebus.engine.result import DebateState

__all__ = [
    "DEFAULT_WORD_LIMITS",
    "FAILURE_POLICIES",
    "PROTOCOLS",
    "Budget",
    "DebateSpec",
    "Judge",
    "Participant",
    "Utility",
    "Verdict",
]

Protocol = Literal["round-robin", "cross-pollination"]
FailurePolicy = Literal["degrade", "strict"]
PROTOCOLS: tuple[str, ...] = ("round-robin", "cross-pollination")
FAILURE_POLICIES: tuple[str, ...] = ("degrade", "strict")
DEFAULT_WORD_LIMITS: Mapping[str, Mapping[str, int]] = {
    "round-robin": {},
    "cross-pollination": {"position": 60, "revision": 150, "synthesis": 380, "audience": 120},
}
DEFAULT_JUDGE_PROMPT = (
    "You are an impartial debate judge. You decide whether the participants agree, summarize the "
    "state of the debate and name a winner only when one argument clearly prevails."
)


@dataclass(frozen=True, slots=True)
class Utility:
    """What a participant optimizes for: shown to it and to the synthesis instead of averaging."""

    maximizes: str
    penalizes: str


@dataclass(frozen=True, slots=True)
class Participant:
    name: str
    system_prompt: str
    llm: LLM | None = None
    utility: Utility | None = None


class Verdict(BaseModel):
    """The default judge ruling. Custom schemas need ``consensus: bool`` unless ``until`` is given."""

    consensus: bool
    summary: str
    winner: str | None = None


@dataclass(frozen=True, slots=True)
class Judge:
    llm: LLM | None = None
    system_prompt: str = DEFAULT_JUDGE_PROMPT
    schema: type[BaseModel] = Verdict
    name: str = "judge"


@dataclass(frozen=True, slots=True)
class Budget:
    """Hard limits for one debate, counted across resumes and checked before every call."""

    max_total_tokens: int | None = None
    max_calls: int | None = None


Until = Callable[["DebateState"], bool]


@dataclass(frozen=True, slots=True)
class DebateSpec:
    """The validated, immutable definition a ``Debate`` runs."""

    name: str
    participants: tuple[Participant, ...]
    llm: LLM | None
    moderator: Participant | None
    judge: Judge | None
    synthesizer: Participant | None
    protocol: str
    max_rounds: int
    until: Until | None
    transcript_window: int | None
    failure_policy: str
    prompts: Prompts
    word_limits: Mapping[str, int]
    audience: str | None
    budget: Budget | None
    deadline_s: float | None
    # Derived once here rather than on every call of every run.
    participant_names: str = field(init=False, repr=False, compare=False)
    word_limit_texts: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = ", ".join(p.name for p in self.participants)
        limits = {phase: word_limit_text(self.word_limits, phase) for phase in self.word_limits}
        object.__setattr__(self, "participant_names", names)
        object.__setattr__(self, "word_limit_texts", limits)

    def llm_for(self, role: Participant | Judge) -> LLM:
        llm = role.llm or self.llm
        assert llm is not None  # guaranteed by validate()
        return llm

    @property
    def synthesis_speaker(self) -> Participant | None:
        """Who writes the synthesis: the synthesizer, else the moderator, else (cross-pollination)
        a neutral speaker on the default LLM."""
        if self.synthesizer is not None:
            return self.synthesizer
        if self.moderator is not None:
            return self.moderator
        if self.protocol == "cross-pollination" and self.llm is not None:
            return Participant("synthesis", "You synthesize debates neutrally.")
        return None

    @property
    def audience_speaker(self) -> Participant:
        chosen = self.moderator or self.synthesizer
        return chosen or Participant("audience", "You model the audience of a debate.")


def build_spec(
    name: str,
    participants: Sequence[Participant],
    *,
    llm: LLM | None,
    moderator: Participant | None,
    judge: Judge | None,
    synthesizer: Participant | None,
    protocol: str,
    max_rounds: int,
    until: Until | None,
    transcript_window: int | None,
    failure_policy: str,
    prompts: Prompts | None,
    word_limits: Mapping[str, int] | None,
    audience: str | None,
    budget: Budget | None,
    deadline_s: float | None,
) -> DebateSpec:
    limits = dict(DEFAULT_WORD_LIMITS.get(protocol, {}))
    limits.update(word_limits or {})
    spec = DebateSpec(
        name=name,
        participants=tuple(participants),
        llm=llm,
        moderator=moderator,
        judge=judge,
        synthesizer=synthesizer,
        protocol=protocol,
        max_rounds=max_rounds,
        until=until,
        transcript_window=transcript_window,
        failure_policy=failure_policy,
        prompts=(prompts or Prompts()).merged_over(
            CROSS_POLLINATION_PROMPTS if protocol == "cross-pollination" else DEFAULT_PROMPTS
        ),
        word_limits=limits,
        audience=audience,
        budget=budget,
        deadline_s=deadline_s,
    )
    validate(spec, prompts)
    return spec


def validate(spec: DebateSpec, prompts: Prompts | None) -> None:
    _validate_shape(spec)
    _validate_llms(spec)
    _validate_judge(spec)
    if prompts is not None:
        for f in fields(prompts):
            template = getattr(prompts, f.name)
            if template is not None:
                validate_template(f.name, template)


def _validate_shape(spec: DebateSpec) -> None:
    if not spec.name or not isinstance(spec.name, str):
        raise ConfigError("Debate needs a non-empty name, e.g. Debate('tech-debate', [...])")
    if not spec.participants:
        raise ConfigError(
            f"Debate {spec.name!r} has no participants: pass at least one Participant"
        )
    names = [p.name for p in spec.participants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(
            f"Debate {spec.name!r} has duplicate participant names {duplicates}: give each "
            "participant a unique name"
        )
    if not isinstance(spec.max_rounds, int) or spec.max_rounds < 1:
        raise ConfigError(f"max_rounds must be an integer ≥ 1, got {spec.max_rounds!r}")
    if spec.transcript_window is not None and spec.transcript_window < 1:
        raise ConfigError(
            f"transcript_window must be ≥ 1 (or None for the whole transcript), "
            f"got {spec.transcript_window!r}"
        )
    if spec.protocol not in PROTOCOLS:
        raise ConfigError(f"unknown protocol {spec.protocol!r}: use one of {list(PROTOCOLS)}")
    if spec.failure_policy not in FAILURE_POLICIES:
        raise ConfigError(
            f"unknown failure_policy {spec.failure_policy!r}: use one of {list(FAILURE_POLICIES)}"
        )
    if spec.protocol == "cross-pollination" and len(spec.participants) < 2:
        raise ConfigError(
            "cross-pollination needs at least 2 participants: each one revises after seeing the "
            "others' positions"
        )
    if spec.deadline_s is not None and spec.deadline_s <= 0:
        raise ConfigError(f"deadline_s must be > 0 seconds, got {spec.deadline_s!r}")


def _validate_llms(spec: DebateSpec) -> None:
    roles: list[tuple[str, Any]] = [(f"participant {p.name!r}", p) for p in spec.participants]
    roles += [
        ("moderator", spec.moderator),
        ("judge", spec.judge),
        ("synthesizer", spec.synthesizer),
    ]
    for label, role in roles:
        if role is not None and role.llm is None and spec.llm is None:
            raise ConfigError(
                f"{label} has no LLM and the debate has no default: pass llm=… to it or to Debate"
            )
    if spec.protocol == "cross-pollination" and spec.synthesis_speaker is None:
        raise ConfigError(
            "cross-pollination ends with a synthesis call: pass synthesizer=…, moderator=… or a "
            "default llm=… to Debate"
        )


def _validate_judge(spec: DebateSpec) -> None:
    if spec.judge is None:
        return
    schema = spec.judge.schema
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise ConfigError(f"Judge schema must be a pydantic model class, got {schema!r}")
    field = schema.model_fields.get("consensus")
    if spec.until is None and (field is None or field.annotation is not bool):
        raise ConfigError(
            f"judge schema {schema.__name__} has no `consensus: bool` field, so the debate could "
            "never stop at consensus: add that field or pass until=… to decide when to stop"
        )
