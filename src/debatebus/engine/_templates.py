"""How prompt templates are filled: ``str.format`` strings of named fields, or callables of a
``PromptContext``.

The topic and the transcript are passed as *values*: ``str.format`` never expands braces inside a
substituted value, so a topic like ``{input}`` or ``{{ x }}`` reaches the model unchanged. A plain
template (``{name}`` fields only, as the shipped ones are) is parsed once into its parts; the
fields a debate fixes can be filled into those once too (``bind_template``), leaving only the
per-call ones to ``fill_parts``.

Binding also marks where the prefix that every call of a debate shares ends (for prompt caching):
before the first field that is not one of ``SHARED_FIELDS``, or, when ``{transcript}`` comes first,
at each turn of the transcript and at its end (each earlier call saw the transcript up to one of
those). ``fill_parts`` returns those offsets as the prompt's *breaks*.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from string import Formatter
from typing import Any

from debatebus.exceptions import ConfigError


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
    sub_debates: str = ""  # cross-pollination 1b: how to ask for a sub-debate, when one may
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


Template = str | Callable[[PromptContext], str]


def render_prompt(template: Template, ctx: PromptContext) -> str:
    if callable(template):
        return template(ctx)
    return fill_template(template, ctx.as_fields())


def fill_template(template: str, values: Mapping[str, Any]) -> str:
    """``template.format_map(values)``; a template of plain ``{name}`` fields (the shipped ones)
    is filled from its parts, parsed once: two to three times faster, on every call."""
    parts = _plain_parts(template)
    if parts is not None:
        return fill_parts(parts, values, template)[0]
    try:
        return template.format_map(values)
    except (KeyError, IndexError, ValueError) as exc:
        raise _unknown_field(template, values, exc) from exc


#: A plain template's literal texts, each with the field that follows it (None after the last).
TemplateParts = tuple[tuple[str, str | None], ...]

#: Fields whose values are the same in every call of a debate at any one time: a prompt's shared
#: prefix (what a provider may cache) runs up to the first field not among them.
SHARED_FIELDS = frozenset({"question", "framing", "participants", "audience", "debate_name"})
# Part names that are not fields (no identifier has "<"): where the shared prefix ends, and the
# transcript within it, which grows call by call (breaks at its turns and its end).
_SHARED_END = "<shared end>"
_SHARED_TRANSCRIPT = "<shared transcript>"


def bind_template(template: Template, fixed: Mapping[str, str]) -> TemplateParts | None:
    """A plain string ``template``'s parts with the ``fixed`` fields filled in once, the texts
    around each field left joined, and the end of the prefix every call shares marked:
    ``fill_parts`` then fills only the others, per call. None for a callable or a template that is
    not plain (``fill_template`` fills those)."""
    parts = None if callable(template) else _plain_parts(template)
    if parts is None:
        return None
    bound: list[tuple[str, str | None]] = []
    text = ""
    shared = True
    for literal, name in parts:
        text += literal
        if name is None:
            continue
        if shared and name == "transcript":
            bound.append((text, _SHARED_TRANSCRIPT))
            text, shared = "", False
            continue
        if shared and name not in SHARED_FIELDS:
            bound.append((text, _SHARED_END))
            text, shared = "", False
        if name in fixed:
            text += fixed[name]
        else:
            bound.append((text, name))
            text = ""
    if shared:  # no field varies: the whole prompt is shared
        bound.append((text, _SHARED_END))
        text = ""
    bound.append((text, None))
    return tuple(bound)


def fill_parts(parts: TemplateParts, values: Mapping[str, Any], template: str,
               transcript_breaks: tuple[int, ...] = ()) -> tuple[str, tuple[int, ...]]:
    """The text of ``parts`` (of ``template``) with its fields filled from ``values``, and its
    breaks: the offsets, ascending, where the prefix it shares with the debate's other calls ends
    (``transcript_breaks``: those within ``values["transcript"]``)."""
    out = []
    breaks: tuple[int, ...] = ()
    try:
        for text, name in parts:
            out.append(text)
            if name is None:
                continue
            if name is _SHARED_END:  # one marker at most: the offsets are summed once
                at = sum(map(len, out))
                breaks = (at,) if at else ()
                continue
            if name is _SHARED_TRANSCRIPT:
                value = values["transcript"]
                breaks = _transcript_breaks(sum(map(len, out)), value, transcript_breaks)
            else:
                value = values[name]
            out.append(value if type(value) is str else format(value))
    except (KeyError, ValueError) as exc:
        raise _unknown_field(template, values, exc) from exc
    return "".join(out), breaks


def _transcript_breaks(at: int, transcript: str, within: tuple[int, ...]) -> tuple[int, ...]:
    """A transcript's breaks once it is placed at ``at``: its start (when something comes before
    it), after each of its turns (``within``, each > 0), its end (unless its last turn ends it)."""
    breaks = [at] if at else []
    breaks += [at + b for b in within]
    end = at + len(transcript)
    if end and (not breaks or breaks[-1] < end):
        breaks.append(end)
    return tuple(breaks)


def _unknown_field(template: str, values: Mapping[str, Any], exc: Exception) -> ConfigError:
    return ConfigError(
        f"prompt template {template[:60]!r}… uses {exc}, which is not a known field; use "
        f"{sorted(values)} (double braces for literal ones)"
    )


@lru_cache(maxsize=256)
def _plain_parts(template: str) -> TemplateParts | None:
    """``template``'s literal texts, each with the field after it; None when a field has a
    conversion, a format spec or an index or attribute, or the template does not parse
    (``format_map`` then does it all, errors included)."""
    try:
        parsed = list(Formatter().parse(template))
    except ValueError:
        return None
    if any(name is not None and (conversion or spec or not name.isidentifier())
           for _, name, spec, conversion in parsed):
        return None
    return tuple((text, name) for text, name, _, _ in parsed)


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
