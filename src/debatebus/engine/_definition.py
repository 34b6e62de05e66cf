"""What a debate is: participants, roles, protocol and limits, validated once at construction."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

from debatebus._pricing import Prices
from debatebus.engine._prompts import (
    ENGLISH,
    Language,
    Prompts,
    SynthesisSections,
    language_named,
    word_limit_text,
)
from debatebus.engine._templates import TemplateParts, bind_template, validate_template
from debatebus.exceptions import ConfigError
from debatebus.llm._base import LLM, model_name

if TYPE_CHECKING:
    from debatebus.engine._debate import DebateMetrics
    from debatebus.engine._result import DebateState
    from debatebus.engine._subdebates import SubDebates

Protocol = Literal["round-robin", "cross-pollination"]
FailurePolicy = Literal["degrade", "strict"]
PROTOCOLS: tuple[Protocol, ...] = get_args(Protocol)
#: The rounds cross-pollination always plays, positions then revisions: ``max_rounds`` does not
#: apply.
CROSS_POLLINATION_ROUNDS = 2
FAILURE_POLICIES: tuple[FailurePolicy, ...] = get_args(FailurePolicy)
DEFAULT_WORD_LIMITS: Mapping[str, Mapping[str, int]] = {
    "round-robin": {},
    "cross-pollination": {"position": 60, "revision": 150, "synthesis": 380, "audience": 120},
}
DEFAULT_JUDGE_PROMPT = ENGLISH.judge_persona
#: How long a person has for a turn unless told otherwise: 10 minutes.
DEFAULT_DEADLINE_S = 600.0


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


@dataclass(frozen=True, slots=True)
class HumanParticipant(Participant):
    """A participant whose turns a person, or any service outside this process, writes: its turn
    is a request published on ``event_type`` and answered by a reply (docs/people.md), within
    ``deadline_s`` seconds (else the turn fails, and the failure policy decides). Its
    ``system_prompt`` is optional: the turn's prompt shows it, as a model participant's."""

    system_prompt: str = ""
    _: KW_ONLY
    event_type: str
    deadline_s: float = DEFAULT_DEADLINE_S

    def __post_init__(self) -> None:
        if not isinstance(self.event_type, str) or not self.event_type:
            raise ConfigError(f"HumanParticipant {self.name!r} needs the event type its turn "
                              "requests are published on, e.g. event_type='debate:turn:alice'")
        if not (isinstance(self.deadline_s, int | float) and self.deadline_s > 0):
            raise ConfigError(f"HumanParticipant {self.name!r}: deadline_s must be > 0 seconds, "
                              f"got {self.deadline_s!r}")

    @property
    def model(self) -> str:
        """What stands for a model name in events and the definition hash."""
        return f"human:{self.event_type}"


class Verdict(BaseModel):
    """The default judge ruling. Custom schemas need ``consensus: bool`` unless ``until`` is given."""

    # What the judge model reads as the schema's description (the docstring is for developers:
    # a small model copied it into its summary).
    model_config = ConfigDict(json_schema_extra={"description": "The judge's ruling on the debate."})

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
    """Hard limits for one debate, counted across resumes and checked before every call: a call is
    not made once its debate has made ``max_calls`` calls, spent ``max_total_tokens`` tokens, or
    spent ``max_cost`` (in the currency of the debate's ``prices``, which must price every model
    the debate uses). Each counts the debate's own calls, not its sub-debates'."""

    max_total_tokens: int | None = None
    max_calls: int | None = None
    max_cost: float | None = None

    def __post_init__(self) -> None:
        cost = self.max_cost
        if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int | float)
                                 or not cost > 0):
            raise ConfigError(f"Budget max_cost must be a positive amount, not {cost!r}")


Until = Callable[["DebateState"], bool]
OnMetrics = Callable[["DebateMetrics"], Awaitable[None] | None]


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class DebateSpec:
    """The validated, immutable definition a ``Debate`` runs: its fields are ``Debate(...)``'s
    arguments, declared here only. ``prompts``/``word_limits`` are kept as given; ``templates`` and
    ``limits`` are them merged over the protocol's defaults (in ``language``, with the synthesis
    shaped by ``synthesis_sections``). A judge with the shipped persona gets it in ``language``.
    ``on_metrics`` is called once at the end of each run with its ``DebateMetrics``.
    ``min_rounds``: the rounds played before the stop rule (the judge's consensus, or ``until``)
    may end the debate; ``max_rounds`` caps it (a request's ``maxRounds`` too).
    ``sub_debates`` (cross-pollination only) lets a 1b position ask a specialist panel: see
    ``debatebus.engine._subdebates`` and docs/sub-debates.md. ``prices`` (``debatebus._pricing``)
    prices its calls: its results carry ``cost`` when they price every model it used, and
    ``budget.max_cost`` needs them."""

    name: str
    participants: Sequence[Participant]
    _: KW_ONLY
    llm: LLM | None = None
    moderator: Participant | None = None
    judge: Judge | None = None
    synthesizer: Participant | None = None
    protocol: Protocol = "round-robin"
    max_rounds: int = 3
    min_rounds: int = 1
    until: Until | None = None
    transcript_window: int | None = None
    failure_policy: FailurePolicy = "degrade"
    prompts: Prompts | None = None
    word_limits: Mapping[str, int] | None = None
    audience: str | None = None
    budget: Budget | None = None
    deadline_s: float | None = None
    language: str = "en"
    synthesis_sections: SynthesisSections | None = None
    on_metrics: OnMetrics | None = None
    sub_debates: SubDebates | None = None
    prices: Prices | None = None
    # Derived once here rather than on every call of every run.
    lang: Language = field(init=False)
    templates: Prompts = field(init=False)
    limits: Mapping[str, int] = field(init=False)
    participant_names: str = field(init=False)
    #: The participants who are people (``HumanParticipant``), by name.
    people: Mapping[str, HumanParticipant] = field(init=False)
    word_limit_texts: Mapping[str, str] = field(init=False)
    utility_texts: Mapping[str, str] = field(init=False)
    #: Every speaking role's system prompt by name (participants, moderator, synthesis speaker,
    #: judge, audience speaker): one dict for all runs, not one per run.
    personas: Mapping[str, str] = field(init=False)
    #: Each plain string template by (phase, speaker), its ``fixed_fields`` filled in.
    bound_templates: Mapping[tuple[str, str], TemplateParts] = field(init=False)
    #: The model name each speaking role calls, by role name (what its calls are priced at).
    models: Mapping[str, str] = field(init=False)

    def __post_init__(self) -> None:
        lang = language_named(self.language)
        limits = {**DEFAULT_WORD_LIMITS.get(self.protocol, {}), **(self.word_limits or {})}
        _check_sections(self)
        _check_sub_debates(self)
        base = lang.defaults(self.protocol, self.synthesis_sections, self.sub_debates is not None)
        derived = {
            "lang": lang,
            "participants": tuple(self.participants),
            "judge": _judge_in(lang, self.judge),
            "templates": (self.prompts or Prompts()).merged_over(base),
            "limits": limits,
            "participant_names": ", ".join(p.name for p in self.participants),
            "people": {p.name: p for p in self.participants if isinstance(p, HumanParticipant)},
            "word_limit_texts": {phase: word_limit_text(limits, phase, lang) for phase in limits},
            "utility_texts": {
                p.name: lang.utility_text(p.utility.maximizes, p.utility.penalizes)
                for p in self.participants if p.utility is not None
            },
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "personas", _personas(self))  # of the derived judge
        validate(self)
        object.__setattr__(self, "models", _models(self))
        _check_prices(self)
        object.__setattr__(self, "bound_templates", _bound_templates(self))

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
            return Participant("synthesis", self.lang.synthesis_persona)
        return None

    @property
    def audience_speaker(self) -> Participant:
        chosen = self.moderator or self.synthesizer
        return chosen or Participant("audience", self.lang.audience_persona)


def _roles(spec: DebateSpec) -> list[Participant | Judge]:
    """Every role that speaks: participants, moderator, synthesis speaker, judge, audience."""
    roles = [*spec.participants, spec.moderator, spec.synthesis_speaker, spec.judge]
    if spec.audience:
        roles.append(spec.audience_speaker)
    return [r for r in roles if r is not None]


def _personas(spec: DebateSpec) -> dict[str, str]:
    return {r.name: r.system_prompt for r in _roles(spec)}


def _models(spec: DebateSpec) -> dict[str, str]:
    """The model of every role that calls one (people need none)."""
    return {r.name: model_name(spec.llm_for(r)) for r in _roles(spec) if r.name not in spec.people}


def _check_prices(spec: DebateSpec) -> None:
    """A cost budget is only kept with a price for every model the debate calls."""
    if spec.budget is None or spec.budget.max_cost is None:
        return
    if spec.prices is None:
        raise ConfigError("Budget(max_cost=…) needs prices: pass prices=… to Debate (e.g. "
                          "debatebus.llm.DEFAULT_PRICES, or Prices.from_file('prices.toml'))")
    missing = spec.prices.missing(set(spec.models.values()))
    if missing:
        raise ConfigError(f"Budget(max_cost=…) needs a price for every model the debate calls; "
                          f"prices has none for {missing}: add them (Prices.updated)")


def fixed_fields(spec: DebateSpec, phase: str, speaker: str) -> dict[str, str]:
    """The template fields that the debate fixes for ``speaker``'s ``phase`` prompt."""
    return {
        "debate_name": spec.name,
        "participants": spec.participant_names,
        "speaker": speaker,
        "word_limit": spec.word_limit_texts.get(phase, ""),
        "persona": spec.personas.get(speaker, ""),
    }


def _bound_templates(spec: DebateSpec) -> dict[tuple[str, str], TemplateParts]:
    bound = {}
    for phase in (f.name for f in fields(Prompts)):
        template = getattr(spec.templates, phase)
        if template is None:
            continue
        for speaker in spec.personas:
            parts = bind_template(template, fixed_fields(spec, phase, speaker))
            if parts is not None:
                bound[phase, speaker] = parts
    return bound


def _judge_in(lang: Language, judge: Judge | None) -> Judge | None:
    """The judge, its shipped persona in ``lang``; a persona of the user's own is kept."""
    if judge is None or judge.system_prompt != DEFAULT_JUDGE_PROMPT:
        return judge
    return replace(judge, system_prompt=lang.judge_persona)


def _check_sections(spec: DebateSpec) -> None:
    """Sections shape the shipped synthesis prompt: refuse them where they would shape nothing."""
    if spec.synthesis_sections is None:
        return
    if spec.prompts is not None and spec.prompts.synthesis is not None:
        raise ConfigError(
            "synthesis_sections shape the shipped synthesis prompt, which prompts.synthesis "
            "replaces: write the structure into your template, or drop one of the two"
        )
    if spec.protocol == "round-robin" and spec.synthesizer is None and spec.moderator is None:
        raise ConfigError(
            "synthesis_sections shape the synthesis, and this round-robin debate writes none: "
            "pass synthesizer=… or moderator=… to Debate"
        )


def _check_sub_debates(spec: DebateSpec) -> None:
    if spec.sub_debates is not None and spec.protocol != "cross-pollination":
        raise ConfigError("sub_debates are asked for in cross-pollination's round 1b: pass "
                          'protocol="cross-pollination", or drop sub_debates')


def validate(spec: DebateSpec) -> None:
    """Raise ConfigError naming what to fix; the given prompts are checked, not the defaults."""
    _validate_shape(spec)
    _validate_llms(spec)
    _validate_judge(spec)
    if spec.prompts is not None:
        for f in fields(spec.prompts):
            template = getattr(spec.prompts, f.name)
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
    _validate_min_rounds(spec)
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


def _validate_min_rounds(spec: DebateSpec) -> None:
    if not isinstance(spec.min_rounds, int) or spec.min_rounds < 1:
        raise ConfigError(f"min_rounds must be an integer ≥ 1, got {spec.min_rounds!r}")
    if spec.min_rounds > spec.max_rounds:
        raise ConfigError(
            f"min_rounds={spec.min_rounds} is over max_rounds={spec.max_rounds}: the stop rule "
            "could never be asked; lower min_rounds or raise max_rounds"
        )
    rounds = CROSS_POLLINATION_ROUNDS
    if spec.protocol == "cross-pollination" and spec.min_rounds > rounds:
        raise ConfigError(
            f"cross-pollination plays {rounds} rounds (positions, then revisions), so "
            f"min_rounds={spec.min_rounds} could never be met: pass min_rounds ≤ {rounds}"
        )


def _validate_llms(spec: DebateSpec) -> None:
    roles: list[tuple[str, Any]] = [(f"participant {p.name!r}", p) for p in spec.participants
                                    if p.name not in spec.people]  # people need no model
    roles += [
        ("moderator", spec.moderator),
        ("judge", spec.judge),
        ("synthesizer", spec.synthesizer),
    ]
    for label, role in roles[-3:]:
        if isinstance(role, HumanParticipant):
            raise ConfigError(f"the {label} writes with a model: a HumanParticipant can only be "
                              "one of the participants")
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
