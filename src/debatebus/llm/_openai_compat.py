"""``OpenAICompatibleLLM``: api.openai.com or any server speaking its Chat Completions API.

Works with Ollama, vLLM, llama.cpp's and llama-cpp-python's servers, LM Studio… The SDK's own
retries are off (``max_retries=0``) so that one policy — ours, in ``retry.py`` — governs every
provider.

Prompt caching: OpenAI caches every prompt of 1024 tokens or more by itself and reports the tokens
read as ``usage.prompt_tokens_details.cached_tokens``. The engine's prompts keep what a debate's
calls share first, byte for byte (the message text is sent as it is, breaks or not), and each call
carries a ``prompt_cache_key`` derived from its debate's id, so that the debate's calls are routed
to where their prefix is cached.

A streamed answer is read by ``debatebus.llm._sse`` (paced reads, each read's events handed on
together), its server-sent events decoded here with msgspec into the few fields a turn needs, a
read's in one call: the SDK's own stream builds a pydantic model of every chunk, which cost 70% of
a token's CPU time, and reads through httpx, which cost most of the rest. Through a proxy, the
SDK's raw streaming response (``with_streaming_response``) is read instead.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from functools import partial
from types import SimpleNamespace
from typing import Any, Literal, NoReturn
from urllib.parse import urlsplit

import msgspec

try:
    import openai
    from openai.types.chat import (
        ChatCompletionAssistantMessageParam,
        ChatCompletionMessageParam,
        ChatCompletionUserMessageParam,
    )
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "OpenAICompatibleLLM needs the openai SDK: pip install 'debatebus[openai]'"
    ) from _exc

from pydantic import BaseModel, ValidationError

from debatebus._redaction import redact
from debatebus._usage import TokenUsage
from debatebus.exceptions import ConfigError, LLMError, LLMResponseError
from debatebus.llm import is_paid_url
from debatebus.llm._base import LLMRequest
from debatebus.llm._provider import (
    DETAIL_LIMIT,
    SDKProvider,
    SDKStream,
    api_key_or_placeholder,
    data_lines,
    key_hint,
)
from debatebus.llm._retry import (
    DEFAULT_TIMEOUT,
    DEFAULT_TOTAL_TIMEOUT,
    ProviderFailure,
    RetryPolicy,
    map_sdk_error,
)
from debatebus.llm._sse import EventSource
from debatebus.llm._structured import Completion, with_json_instructions

StructuredMode = Literal["auto", "json_schema", "json_object", "instructions"]
_MODES: tuple[StructuredMode, ...] = ("auto", "json_schema", "json_object", "instructions")
# What "auto" tries, best first, stepping down when a server rejects a response_format.
_LADDER: tuple[StructuredMode, ...] = ("json_schema", "json_object", "instructions")
# OpenAI's Chat Completions API takes at most 4 stop sequences; the engine cuts turns itself too.
MAX_STOP_SEQUENCES = 4
# OpenAI caches prompts of this many tokens and more (in steps of 128): its prompt caching guide.
MIN_CACHEABLE_TOKENS = 1024


def _error_detail(exc: openai.APIError) -> str:
    """The server's own error message when the body has one (shorter than the SDK's repr)."""
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)  # the SDK may already have unwrapped {"error": …}
        if isinstance(error, dict):
            error = error.get("message") or error.get("detail")
        if error:
            return str(error)[:DETAIL_LIMIT]
    return exc.message[:DETAIL_LIMIT]


def map_openai_error(exc: BaseException, *, model: str, base_url: str) -> ProviderFailure | None:
    """Translate an ``openai`` SDK exception into our tree; None for anything else."""
    return map_sdk_error(
        exc, openai, openai.OpenAIError, _error_detail, model=model, base_url=base_url
    )


class _NotStrictable(Exception):
    pass


_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")


def _strict(node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node and len(node) > 1:
        raise _NotStrictable  # strict mode forbids keywords beside $ref
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "default":
            continue  # every property becomes required, so defaults never apply
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _strict(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [_strict(sub) for sub in value]
        elif key == "items" and isinstance(value, dict):
            out[key] = _strict(value)
        else:
            out[key] = value
    if out.get("type") == "object":
        if out.get("additionalProperties", False) is not False:
            raise _NotStrictable  # dict-like objects cannot be strict
        out["additionalProperties"] = False
        out["required"] = list(out.get("properties", {}))
    return out


def strict_json_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """``schema`` in the form OpenAI's ``strict`` mode accepts, or None when it can't be.

    Requiring every property is safe: pydantic accepts explicit values for defaulted fields.
    """
    try:
        return _strict(copy.deepcopy(schema))
    except _NotStrictable:
        return None


def _response_format(schema: type[BaseModel], mode: StructuredMode) -> dict[str, Any] | None:
    """The ``response_format`` for ``mode``: None for plain instructions.

    ``json_object`` carries the schema too: llama.cpp's and llama-cpp-python's servers compile it
    into a grammar; servers that don't know the field ignore it.
    """
    plain = schema.model_json_schema()
    if mode == "json_object":
        return {"type": "json_object", "schema": plain}
    if mode != "json_schema":
        return None
    strict = strict_json_schema(plain)
    name = re.sub(r"[^A-Za-z0-9_-]", "_", schema.__name__)[:64] or "response"
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": strict or plain, "strict": strict is not None},
    }


def _rejects_format(exc: BaseException | None) -> bool:
    """Whether a server refused a response_format: a 400/422, or any status whose error names it.

    llama-cpp-python's server, for one, answers an unknown response_format type with a 500 that
    retrying cannot fix.
    """
    if isinstance(exc, openai.BadRequestError | openai.UnprocessableEntityError):
        return True
    if not isinstance(exc, openai.APIStatusError):
        return False
    said = f"{exc.message} {exc.body}"
    return "response_format" in said or "json_schema" in said


def _map_structured_error(
    exc: BaseException, *, model: str, base_url: str
) -> ProviderFailure | None:
    """``map_openai_error`` for calls carrying a response_format: its rejection is final."""
    if _rejects_format(exc):
        assert isinstance(exc, openai.APIStatusError)
        detail = _error_detail(exc)
        error = LLMError(f"{model}: HTTP {exc.status_code}, response_format rejected: {detail}")
        return ProviderFailure(error, exc)
    return map_openai_error(exc, model=model, base_url=base_url)


def _messages(request: LLMRequest) -> list[ChatCompletionMessageParam]:
    messages: list[ChatCompletionMessageParam] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    for message in request.messages:
        if message.role == "assistant":
            messages.append(
                ChatCompletionAssistantMessageParam(role="assistant", content=message.content)
            )
        else:
            messages.append(ChatCompletionUserMessageParam(role="user", content=message.content))
    return messages


def _usage(completion: Any) -> TokenUsage | None:
    usage = getattr(completion, "usage", None)
    prompt = getattr(usage, "prompt_tokens", None)
    answer = getattr(usage, "completion_tokens", None)
    if not isinstance(prompt, int) or not isinstance(answer, int):
        return None
    total = getattr(usage, "total_tokens", None)
    # Included in prompt_tokens; servers without caching leave the details out (or null).
    cached = getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None)
    return TokenUsage(prompt, answer, total if isinstance(total, int) else prompt + answer,
                      cached if isinstance(cached, int) else 0)


def _is_openai(base_url: str) -> bool:
    """Whether ``base_url`` is OpenAI's own API (which takes ``prompt_cache_key``)."""
    host = (urlsplit(base_url).hostname or "").lower().rstrip(".")
    return host == "openai.com" or host.endswith(".openai.com")


def prompt_cache_key(cache_key: str) -> str:
    """What a request with ``cache_key`` (its debate's id) sends as ``prompt_cache_key``: a hash,
    so that no debate id reaches the provider."""
    return "debatebus-" + hashlib.blake2b(cache_key.encode(), digest_size=12).hexdigest()


def _to_completion(completion: Any, model: str) -> Completion:
    """The text and usage of a chat completion; LLMResponseError when the body has no answer."""
    try:
        message = completion.choices[0].message
    except (AttributeError, IndexError, KeyError, TypeError) as exc:
        raise LLMResponseError(
            f"{model}: malformed response without choices: {completion!r:.300}"
        ) from exc
    content = getattr(message, "content", None)
    refusal = getattr(message, "refusal", None)
    if content is None and refusal:
        raise LLMResponseError(f"{model}: the model refused: {refusal!r:.300}")
    if content is not None and not isinstance(content, str):
        raise LLMResponseError(f"{model}: malformed response content: {content!r:.300}")
    return Completion(content or "", _usage(completion), completion)


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None


class _Choice(msgspec.Struct, gc=False):
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct, gc=False):
    """What a turn reads of a streamed chat completion chunk (other fields are skipped)."""

    choices: list[_Choice] = msgspec.field(default_factory=list)
    usage: dict[str, Any] | None = None
    error: Any = None


_CHUNK = msgspec.json.Decoder(_Chunk)
_CHUNKS = msgspec.json.Decoder(list[_Chunk])
_DONE = b"[DONE]"


def _chunks(datas: list[bytes], model: str) -> list[_Chunk]:
    """The chunks of one read's events, decoded in one go (the ``[DONE]`` left out by the
    caller); an ``LLMResponseError`` naming the one that is not a chunk."""
    try:
        return _CHUNKS.decode(b"[" + b",".join(datas) + b"]")
    except msgspec.DecodeError:
        for data in datas:
            try:
                _CHUNK.decode(data)
            except msgspec.DecodeError as exc:
                raise LLMResponseError(
                    f"{model}: malformed stream event {data[:200].decode(errors='replace')!r}: "
                    f"{exc}") from exc
        raise


def _ending(chunk: _Chunk) -> bool:
    """Whether ``chunk`` says the answer is written: its finish reason, or the usage that
    ``include_usage`` sends last."""
    return chunk.usage is not None or bool(chunk.choices and chunk.choices[0].finish_reason)


class _ChunkBatches:
    """A streaming response's ``data:`` events read by ``debatebus.llm._sse``, decoded, a batch
    per read, up to ``[DONE]``; once a chunk says the answer is written, the rest is read as it
    comes (``EventSource.hurry``)."""

    def __init__(self, source: EventSource, model: str) -> None:
        self._source = source
        self._model = model

    async def __aiter__(self) -> AsyncIterator[list[_Chunk]]:
        async for datas in self._source.batches():
            done = _DONE in datas
            if done:
                datas = datas[:datas.index(_DONE)]
            if datas:
                chunks = _chunks(datas, self._model)
                if _ending(chunks[-1]):
                    self._source.hurry()
                yield chunks
            if done:
                return

    async def close(self) -> None:
        self._source.close()


class _ChunkStream:
    """The same through the SDK's raw streaming response (a proxied server), an event at a
    time."""

    def __init__(self, response: Any, model: str) -> None:
        self._response = response
        self._model = model

    async def __aiter__(self) -> AsyncIterator[list[_Chunk]]:
        async for data in data_lines(self._response):
            if data == _DONE:
                return
            yield _chunks([data], self._model)

    async def close(self) -> None:
        await self._response.close()


class _ChunkReader:
    """A streamed chat completion's chunks: the text of each batch, and the usage the last
    reports (``stream_options.include_usage``; a server that ignores it reports none)."""

    __slots__ = ("model", "usage")

    def __init__(self, model: str) -> None:
        self.model = model
        self.usage: TokenUsage | None = None

    def feed(self, chunks: Sequence[_Chunk]) -> str:
        parts = []
        for chunk in chunks:
            if chunk.error is not None:  # a server's error after the stream began
                self._fail(chunk.error)
            if chunk.usage is not None:
                self._note(chunk.usage)
            if chunk.choices and (delta := chunk.choices[0].delta) is not None and delta.content:
                parts.append(delta.content)
        return "".join(parts)

    def _fail(self, error: Any) -> NoReturn:
        said = error.get("message", error) if isinstance(error, dict) else error
        raise LLMError(f"{self.model}: the server reported an error: {str(said)[:DETAIL_LIMIT]}")

    def _note(self, reported: dict[str, Any]) -> None:
        try:  # read as complete reads it, from the SDK's usage model
            usage = openai.types.CompletionUsage.model_validate(reported)
        except ValidationError:
            usage = None
        self.usage = _usage(SimpleNamespace(usage=usage))


class OpenAICompatibleLLM(SDKProvider[openai.AsyncOpenAI]):
    """A model behind an OpenAI-compatible Chat Completions endpoint.

    ``structured`` picks how judges get JSON: ``"json_schema"`` sends a JSON-schema
    ``response_format`` (strict when the schema allows); ``"json_object"`` sends JSON mode with the
    schema attached (grammar-constrained on llama.cpp servers); ``"instructions"`` only asks for
    JSON in the system prompt (it always does that too); ``"auto"`` tries them in that order and
    keeps the first the server accepts. Either way the answer is validated and repaired once.

    The key comes from ``api_key`` or ``OPENAI_API_KEY``; a server that is not a paid provider gets
    a placeholder when neither is set (for a paid one it is a ``ConfigError``). ``timeout`` bounds
    one attempt, ``total_timeout`` one call over all its attempts and waits. ``retry_policy``, when
    given, replaces the policy built from ``timeout``, ``total_timeout`` and ``max_retries``.

    ``send_prompt_cache_key``: send each debate's ``prompt_cache_key`` (a hash of its id); None
    (the default) sends it to OpenAI's own API only (``*.openai.com``), since servers that refuse
    unknown fields would fail the call. True for a compatible server that accepts it, False never.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        total_timeout: float | None = DEFAULT_TOTAL_TIMEOUT,
        max_retries: int = 3,
        max_tokens: int | None = None,
        structured: StructuredMode = "auto",
        retry_policy: RetryPolicy | None = None,
        send_prompt_cache_key: bool | None = None,
    ) -> None:
        if structured not in _MODES:
            raise ConfigError(f"structured must be one of {', '.join(_MODES)}, not {structured!r}")
        if not model:
            raise ConfigError("OpenAICompatibleLLM needs a model name, e.g. 'gpt-4o-mini'")
        key = api_key_or_placeholder(
            api_key, key_env="OPENAI_API_KEY", base_url=base_url, base_url_env="OPENAI_BASE_URL"
        )
        try:
            client = openai.AsyncOpenAI(
                api_key=key, base_url=base_url, timeout=timeout, max_retries=0
            )
        except openai.OpenAIError as exc:  # no key (the SDK's message lists what it accepts)
            said = redact(str(exc), [key])
            raise ConfigError(f"{model}: {key_hint('OPENAI_API_KEY')} ({said})") from None
        super().__init__(
            model,
            client,
            api_key=key,
            map_error=map_openai_error,
            timeout=timeout,
            total_timeout=total_timeout,
            max_retries=max_retries,
            retry_policy=retry_policy,
        )
        self._temperature = temperature
        self._max_tokens = max_tokens
        self._structured: StructuredMode = structured
        self._rung = 0  # position on _LADDER reached by "auto"
        self._classify_structured = partial(
            _map_structured_error, model=model, base_url=self._shown_url
        )
        self._cache_key = (_is_openai(self._base_url) if send_prompt_cache_key is None
                           else send_prompt_cache_key)

    async def _send_structured(self, request: LLMRequest) -> Completion:
        schema = request.response_schema
        assert schema is not None
        # The schema goes into the prompt in every mode: a grammar-constrained local server
        # enforces the shape but never shows the model what the fields mean.
        prompted = with_json_instructions(request, schema)
        if self._structured != "auto":
            return await self._send(prompted, _response_format(schema, self._structured))
        rung = self._rung
        while True:
            try:
                answer = await self._send(prompted, _response_format(schema, _LADDER[rung]))
            except LLMError as exc:
                if rung == len(_LADDER) - 1 or not _rejects_format(exc.__cause__):
                    raise
                rung += 1
                continue
            # Remembered only once accepted, so a 400 with another cause can't stick.
            self._rung = rung
            return answer

    def _params(self, request: LLMRequest) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if self._temperature is not None:
            params["temperature"] = self._temperature
        max_tokens = request.max_tokens or self._max_tokens
        if max_tokens is not None:
            # OpenAI's reasoning models reject max_tokens; most other servers only know max_tokens.
            name = "max_completion_tokens" if is_paid_url(self._base_url) else "max_tokens"
            params[name] = max_tokens
        if request.stop:
            params["stop"] = list(request.stop[:MAX_STOP_SEQUENCES])
        if self._cache_key and request.cache_key:
            # As an extra field: SDKs older than the parameter would refuse the keyword.
            params["extra_body"] = {"prompt_cache_key": prompt_cache_key(request.cache_key)}
        return params

    async def _send(
        self, request: LLMRequest, response_format: dict[str, Any] | None = None
    ) -> Completion:
        messages = _messages(request)
        params = self._params(request)
        if response_format is not None:
            params["response_format"] = response_format

        async def attempt() -> Completion:
            completion = await self._client.chat.completions.create(
                model=self._model, messages=messages, **params
            )
            return _to_completion(completion, self._model)

        answer = await self._with_retries(
            attempt, self._classify if response_format is None else self._classify_structured
        )
        self._note_usage(request, answer.usage)
        return answer

    def _note_usage(self, request: LLMRequest, usage: TokenUsage | None) -> None:
        if self._cache_key and usage is not None:
            self._note_too_short_to_cache(usage.prompt_tokens, MIN_CACHEABLE_TOKENS)

    async def _open_stream(self, request: LLMRequest, interval_s: float) -> SDKStream:
        params = self._params(request)
        messages = _messages(request)
        if self._proxied:
            # Entered here, closed by the stream: an error status is raised on entering.
            response = await self._client.chat.completions.with_streaming_response.create(
                model=self._model, messages=messages, stream=True,
                stream_options={"include_usage": True}, **params).__aenter__()
            return _ChunkStream(response, self._model)
        extra = params.pop("extra_body", {})
        body = {"model": self._model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, **params, **extra}
        source = await self._open_events("/chat/completions", body, interval_s)
        return _ChunkBatches(source, self._model)

    def _sdk_headers(self) -> Mapping[str, object]:
        return {**self._client.default_headers, **self._client.auth_headers}

    def _stream_reader(self) -> _ChunkReader:
        return _ChunkReader(self._model)
