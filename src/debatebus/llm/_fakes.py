"""Deterministic models shipped in the package so users can test debates without a key or network.

Usage is whitespace word counts (prompt = system + messages, completion = response text), so token
accounting can be asserted exactly. Both stream (``stream``) their answer a word at a time, each
piece with the whitespace after it, ``stream_pause_s`` apart: a long answer then takes as long to
write as a model's would.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from debatebus._usage import TokenUsage
from debatebus.exceptions import ConfigError, LLMResponseError, ScriptExhaustedError
from debatebus.llm._base import LLM, LLMRequest, LLMResponse, LLMStream, Piece
from debatebus.llm._retry import Redactor
from debatebus.llm._structured import extract_json_object

Reply = str | Mapping[str, Any] | BaseException | LLMResponse | Callable[[LLMRequest], Any]

#: Masks secrets (a URL's password, a key) in what a script or function raises, as every provider
#: does: the message becomes a failed turn's error, in events, results and the store.
_REDACTOR = Redactor()
#: A word and the whitespace after it, or leading whitespace: the pieces join up to the text.
_WORD = re.compile(r"\s+|\S+\s*")


def word_usage(request: LLMRequest, text: str) -> TokenUsage:
    prompt = len(request.system.split()) + sum(len(m.content.split()) for m in request.messages)
    return TokenUsage.of(prompt, len(text.split()))


def _structured(request: LLMRequest, data: Any, model: str, text: str) -> BaseModel | None:
    """Validate ``data`` against the request's schema; a failure still charges the answer's words."""
    schema = request.response_schema
    if schema is None:
        return None
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise LLMResponseError(
            f"{model}: scripted output {data!r} does not validate as "
            f"{schema.__name__}: {exc.errors()[0]['msg']}",
            usage=word_usage(request, text),
        ) from exc


def _parse_json(request: LLMRequest, text: str, model: str) -> dict[str, Any]:
    data = extract_json_object(text)
    if data is None:
        raise LLMResponseError(
            f"{model}: scripted output {text[:200]!r} is not valid JSON: it holds no JSON object",
            usage=word_usage(request, text),
        )
    return data


def _to_response(request: LLMRequest, reply: object, model: str) -> LLMResponse:
    """Turn whatever a script or function returned into an LLMResponse (raising exceptions)."""
    if isinstance(reply, BaseException):
        raise reply
    if isinstance(reply, LLMResponse):
        return reply
    if isinstance(reply, BaseModel):
        text = reply.model_dump_json()
        return LLMResponse(text, reply, word_usage(request, text), model)
    if isinstance(reply, Mapping):
        text = json.dumps(reply)
        structured = _structured(request, dict(reply), model, text)
        return LLMResponse(text, structured, word_usage(request, text), model)
    if isinstance(reply, str):
        structured = None
        if request.response_schema is not None and reply.lstrip().startswith("{"):
            structured = _structured(request, _parse_json(request, reply, model), model, reply)
        return LLMResponse(reply, structured, word_usage(request, reply), model)
    raise TypeError(f"{model}: cannot turn {type(reply).__name__} into a response")


async def _respond(request: LLMRequest, reply: Callable[[], Any], model: str) -> LLMResponse:
    """``reply()`` (awaited when it gives an awaitable) as a response; whatever it raises, or
    returns as an exception, is raised with its secrets masked."""
    try:
        answer = reply()
        if inspect.isawaitable(answer):
            answer = await answer
        return _to_response(request, answer, model)
    except Exception as exc:
        _REDACTOR.scrub(exc)
        raise


async def word_pieces(answer: Callable[[], Awaitable[LLMResponse]],
                      pause_s: float) -> AsyncGenerator[Piece, None]:
    """The source of a fake's stream: ``await answer()``'s text a word at a time, ``pause_s``
    before each word (none: no wait at all), then the response."""
    response = await answer()
    if response.structured is None:
        for piece in _WORD.findall(response.text):
            if pause_s:
                await asyncio.sleep(pause_s)
            yield piece
    elif response.text:  # structured output is not streamed word by word
        yield response.text
    yield response


def _check_pause(pause_s: float) -> float:
    if not pause_s >= 0:  # also refuses NaN
        raise ConfigError(f"stream_pause_s must be ≥ 0 seconds, got {pause_s!r}")
    return pause_s


class ScriptedLLM(LLM):
    """Answers each call with the next scripted entry.

    An entry is a string, a dict (structured output, validated against the request's schema), an
    exception instance (raised), an ``LLMResponse``, or a callable of the request returning any of
    these (sync or async). ``requests`` records every request, in call order.
    """

    __test__ = False

    def __init__(self, responses: Iterable[Reply], *, model: str = "scripted",
                 stream_pause_s: float = 0.0) -> None:
        self._responses = list(responses)
        self._next = 0
        self._model = model
        self._pause_s = _check_pause(stream_pause_s)
        self.requests: list[LLMRequest] = []

    @property
    def model(self) -> str:
        return self._model

    @property
    def remaining(self) -> int:
        return len(self._responses) - self._next

    async def complete(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        if self._next >= len(self._responses):
            raise ScriptExhaustedError(
                f"{self._model}: call {self._next + 1} ({request.purpose} by "
                f"{request.speaker or 'unknown'}, round {request.round}) has no scripted response; "
                f"the script holds {len(self._responses)}"
            )
        reply: Any = self._responses[self._next]
        self._next += 1
        if callable(reply) and not isinstance(reply, BaseException | type):
            return await _respond(request, lambda: reply(request), self._model)
        return await _respond(request, lambda: reply, self._model)

    def stream(self, request: LLMRequest, *, interval_s: float = 0.0) -> LLMStream:
        """The next scripted answer, a word at a time (``stream_pause_s`` apart, whatever
        ``interval_s``: nothing is read)."""
        return LLMStream(word_pieces(lambda: self.complete(request), self._pause_s))


class FunctionLLM(LLM):
    """Calls ``fn(request)`` (sync or async) for every request and wraps what it returns."""

    __test__ = False

    def __init__(
        self,
        fn: Callable[[LLMRequest], Any] | Callable[[LLMRequest], Awaitable[Any]],
        *,
        model: str = "function",
        stream_pause_s: float = 0.0,
    ) -> None:
        self._fn = fn
        self._model = model
        self._pause_s = _check_pause(stream_pause_s)
        self.requests: list[LLMRequest] = []

    @property
    def model(self) -> str:
        return self._model

    async def complete(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        return await _respond(request, lambda: self._fn(request), self._model)

    def stream(self, request: LLMRequest, *, interval_s: float = 0.0) -> LLMStream:
        """``fn``'s answer a word at a time (``stream_pause_s`` apart, whatever ``interval_s``)."""
        return LLMStream(word_pieces(lambda: self.complete(request), self._pause_s))
