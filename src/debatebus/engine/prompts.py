"""The shipped prompts and how templates are filled.

Templates are ``str.format`` strings filled with named fields, or callables of a ``PromptContext``.
The topic and the transcript are passed as *values*: ``str.format`` never expands braces inside a
substituted value, so a topic like ``{input}`` or ``{{ x }}`` reaches the model unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from string import Formatter
from typing import Any

from debatebus.exceptions import ConfigError

__all__ = [
    "CROSS_POLLINATION_PROMPTS",
    "DEFAULT_PROMPTS",
    "PROTOCOL_VERSION",
    "SHARED_SYSTEM",
    "PromptContext",
    "Prompts",
    "fill_template",
    "names_persona",
    "render_prompt",
    "template_fields",
    "word_limit_text",
]

# Bump when a shipped prompt or the protocol's shape changes: checkpoints record it (drift guard).
PROTOCOL_VERSION = "2"


@dataclass(frozen=True, slots=True)
class PromptContext:
    """Everything a prompt may use. Fields are also the names available to string templates."""

    question: str
    debate_name: str
    speaker: str
    round: int
    framing: str
    transcript: str
    participants: str
    word_limit: str
    maximizes: str = ""
    penalizes: str = ""
    utility: str = ""
    audience: str = ""
    positions: str = ""
    persona: str = ""
    state: Any = None  # the DebateState, for callable prompts
    extra: Mapping[str, Any] = field(default_factory=dict)

    def as_fields(self) -> dict[str, Any]:
        values = {name: getattr(self, name) for name in _TEMPLATE_FIELDS}
        if self.extra:
            values.update(self.extra)
        return values


_TEMPLATE_FIELDS = tuple(f.name for f in fields(PromptContext) if f.name not in ("extra", "state"))
_EMPTY_FIELDS: dict[str, Any] = dict.fromkeys(_TEMPLATE_FIELDS, "")


def template_fields(**values: Any) -> dict[str, Any]:
    """Every field a string template may name, empty unless given (``PromptContext.as_fields``
    without building a context: the engine's hot path for string templates)."""
    return {**_EMPTY_FIELDS, **values}


def word_limit_text(limits: Mapping[str, int], phase: str) -> str:
    limit = limits.get(phase)
    return f" Answer in at most {limit} words." if limit else ""


Template = str | Callable[[PromptContext], str]

# Every shipped prompt shares one system prompt and opens with what the whole debate shares (question,
# framing, participants, transcript); the speaker's persona and task come last. Consecutive calls
# then share their longest prefix, which llama.cpp reuses instead of evaluating it again, and which
# OpenAI and Anthropic prompt caching reward. A speaker's own system prompt is its ``{persona}``.
SHARED_SYSTEM = (
    "You take part in a written debate. When it is your turn, write only your own contribution, "
    "in plain prose. Never write lines for other participants, never label speakers and never "
    "rewrite the debate."
)
_CONTEXT = (
    "Debate topic: {question}\n{framing}Participants: {participants}\n\nTranscript so far:\n"
    "{transcript}\n\n---\nNow it is {speaker}'s turn. {persona}\n"
)
_OPENING = (
    _CONTEXT + "Round {round}: give your opening position with your strongest arguments, in your "
    "own words only.{word_limit}"
)
_REBUTTAL = (
    _CONTEXT + "Round {round}: respond to the other participants, rebut what you disagree with "
    "and refine your position, in your own words only.{word_limit}"
)
_JUDGE = (
    _CONTEXT + "After round {round}, decide whether the participants have reached consensus and "
    "summarize the state of the debate in one or two sentences. Answer with JSON only, matching "
    "the requested schema."
)
_SYNTHESIS = (
    _CONTEXT + "Write a balanced synthesis: the points of agreement, the remaining tensions and a "
    "recommendation, each in a sentence of its own.{word_limit}"
)
_FRAMING = (
    "Debate topic: {question}\nParticipants: {participants}\n\n---\nNow it is {speaker}'s turn. "
    "{persona}\nFrame this debate in a few sentences: the key question, what is at stake and what "
    "a good answer must address."
)
_AUDIENCE = (
    "Debate topic: {question}\nAudience: {audience}\n\n---\nNow it is {speaker}'s turn. {persona}\n"
    "Describe what this audience knows, needs and cares about, so the participants can address "
    "it.{word_limit}"
)
_POSITION = (
    "Topic: {question}\n{framing}{audience}\n---\nNow it is {speaker}'s turn. {persona}{utility}\n"
    "State your independent position.{word_limit}"
)
_REVISION = (
    "Topic: {question}\n{framing}{audience}\n---\nNow it is {speaker}'s turn. {persona}{utility}\n"
    "The other participants' positions:\n{positions}\n\nRevise your position after considering "
    "theirs.{word_limit}"
)
_CROSS_SYNTHESIS = (
    "Topic: {question}\n{audience}Revised positions, with what each participant maximizes and "
    "penalizes:\n{positions}\n\n---\nNow it is {speaker}'s turn. {persona}\nDo not average the "
    "positions. Show the tensions between these utilities and the equilibrium that best respects "
    "them.{word_limit}"
)


@dataclass(frozen=True, slots=True)
class Prompts:
    """Overrides for any shipped prompt; ``None`` keeps the default."""

    opening: Template | None = None
    rebuttal: Template | None = None
    judge: Template | None = None
    synthesis: Template | None = None
    framing: Template | None = None
    audience: Template | None = None
    position: Template | None = None
    revision: Template | None = None

    def merged_over(self, base: Prompts) -> Prompts:
        return Prompts(
            **{f.name: getattr(self, f.name) or getattr(base, f.name) for f in fields(self)}
        )

    def get(self, name: str) -> Template:
        template: Template | None = getattr(self, name)
        if template is None:  # only reachable on an un-merged instance
            raise ConfigError(f"no prompt named {name!r}")
        return template


DEFAULT_PROMPTS = Prompts(
    opening=_OPENING,
    rebuttal=_REBUTTAL,
    judge=_JUDGE,
    synthesis=_SYNTHESIS,
    framing=_FRAMING,
    audience=_AUDIENCE,
    position=_POSITION,
    revision=_REVISION,
)
# Cross-pollination's synthesis weighs utilities instead of reading a transcript.
CROSS_POLLINATION_PROMPTS = Prompts(
    **{
        **{f.name: getattr(DEFAULT_PROMPTS, f.name) for f in fields(Prompts)},
        "synthesis": _CROSS_SYNTHESIS,
    }
)


def render_prompt(template: Template, ctx: PromptContext) -> str:
    if callable(template):
        return template(ctx)
    return fill_template(template, ctx.as_fields())


def fill_template(template: str, values: Mapping[str, Any]) -> str:
    try:
        return template.format_map(values)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"prompt template {template[:60]!r}… uses {exc}, which is not a known field; use "
            f"{sorted(values)} (double braces for literal ones)"
        ) from exc


def names_persona(template: Template) -> bool:
    """Whether a template places the speaker's persona itself (``{persona}``); if it does not (or
    is a callable), the persona stays the request's system prompt, as before protocol 2."""
    return not callable(template) and _names_persona(template)


@lru_cache(maxsize=64)
def _names_persona(template: str) -> bool:
    return any(name == "persona" for _, name, _, _ in Formatter().parse(template))


def validate_template(name: str, template: Template) -> None:
    """Fail at construction, not mid-debate, on a template that names an unknown field."""
    if callable(template):
        return
    if not isinstance(template, str):
        raise ConfigError(f"prompt {name!r} must be a str.format template or a callable")
    render_prompt(template, PromptContext("", "", "", 0, "", "", "", ""))
