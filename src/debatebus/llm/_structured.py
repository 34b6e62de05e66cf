"""Structured output shared by the providers: ask for JSON, extract it, validate it, repair once.

Providers differ in *how* they ask (a JSON-schema ``response_format``, a grammar, or plain
instructions at the end of the prompt) but not in what happens afterwards, which lives here: the
first JSON object in the answer is validated by the request's pydantic schema; if that fails the
model gets its answer back with the validation error and one chance to fix it; if that fails too,
an ``LLMResponseError`` names the model and quotes the raw text. Tokens of every attempt are
counted.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from debatebus._usage import TokenUsage
from debatebus.exceptions import LLMError, LLMResponseError
from debatebus.llm._base import LLMRequest, LLMResponse, Message

_QUOTE_LIMIT = 500  # characters of raw model text quoted in an error message
_ECHO_LIMIT = 2000  # characters of a bad answer sent back for repair (small contexts overflow)


@dataclasses.dataclass(frozen=True, slots=True)
class Completion:
    """One raw answer from a provider, before any structured parsing."""

    text: str
    usage: TokenUsage | None = None
    raw: Any = dataclasses.field(default=None, repr=False)


Send = Callable[[LLMRequest], Awaitable[Completion]]


class InvalidStructuredOutput(ValueError):
    """The text holds no JSON object, or the object does not validate; the message says why."""


def add_usage(total: TokenUsage | None, more: TokenUsage | None) -> TokenUsage | None:
    if total is None:
        return more
    return total if more is None else total + more


def json_instructions(schema: type[BaseModel]) -> str:
    return (
        "Answer with only one JSON object — no prose, no code fences — that validates against "
        f"this JSON schema:\n{json.dumps(schema.model_json_schema(), separators=(',', ':'))}"
    )


def with_json_instructions(request: LLMRequest, schema: type[BaseModel]) -> LLMRequest:
    """``request`` asking for JSON: the instructions, with the schema, close its last message.
    Not in the system prompt: the system prompt and the prompt's shared prefix stay those of the
    debate's other calls, which a provider's prompt cache (and llama.cpp's) reuses."""
    instructions = json_instructions(schema)
    *head, last = request.messages or (Message("user", ""),)
    content = f"{last.content}\n\n{instructions}" if last.content else instructions
    return dataclasses.replace(request, messages=(*head, Message(last.role, content, last.breaks)))


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The first ``{…}`` in ``text`` that parses as a JSON object (prose and fences around it ignored)."""
    decoder = json.JSONDecoder(strict=False)  # small models put raw newlines inside strings
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


def _describe(exc: ValidationError) -> str:
    parts = [
        f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
        for err in exc.errors()[:3]
    ]
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse_structured(text: str, schema: type[BaseModel]) -> BaseModel:
    data = extract_json_object(text)
    if data is None:
        raise InvalidStructuredOutput("the answer contains no JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise InvalidStructuredOutput(
            f"it does not validate as {schema.__name__}: {_describe(exc)}"
        ) from exc


def repair_request(request: LLMRequest, bad_text: str, reason: str) -> LLMRequest:
    """The original conversation, the bad answer, and a request to fix it."""
    echoed = bad_text[:_ECHO_LIMIT] or "(empty answer)"
    fix = (
        f"Your answer is not valid: {reason}. Reply again with only one JSON object that matches "
        "the schema — no prose, no code fences."
    )
    messages = (*request.messages, Message("assistant", echoed), Message("user", fix))
    return dataclasses.replace(request, messages=messages, purpose=f"{request.purpose} (repair)")


def _quote(text: str) -> str:
    return repr(text if len(text) <= _QUOTE_LIMIT else text[:_QUOTE_LIMIT] + "…")


async def complete_structured(
    request: LLMRequest,
    send: Send,
    *,
    model: str,
    redact: Callable[[str], str] = lambda text: text,
) -> LLMResponse:
    """Ask via ``send``, validate against ``request.response_schema``, repair once, else raise."""
    schema = request.response_schema
    if schema is None:
        raise TypeError("complete_structured needs a request with a response_schema")
    first = await send(request)
    try:
        return LLMResponse(
            first.text, parse_structured(first.text, schema), first.usage, model, first.raw
        )
    except InvalidStructuredOutput as exc:
        reason = str(exc)
    try:
        second = await send(repair_request(request, first.text, reason))
    except LLMError as exc:
        exc.usage = add_usage(first.usage, exc.usage)
        raise
    usage = add_usage(first.usage, second.usage)
    try:
        structured = parse_structured(second.text, schema)
    except InvalidStructuredOutput as exc:
        raise LLMResponseError(
            redact(
                f"{model}: no valid {schema.__name__} after one repair attempt ({exc}); "
                f"raw text: {_quote(second.text)}"
            ),
            usage=usage,
        ) from exc
    return LLMResponse(second.text, structured, usage, model, second.raw)
