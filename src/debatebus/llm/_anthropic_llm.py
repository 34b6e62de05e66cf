"""``AnthropicLLM``: Claude through the official SDK's Messages API.

Structured output (judges) uses the same path as every other provider — the schema in the system
prompt, the first JSON object extracted from the answer, validation, one repair — because it works
on every Claude model and every Messages-compatible proxy.

Prompt caching: a message with ``breaks`` (where a prefix the debate's other calls share ends) is
sent as text blocks cut there, with ``cache_control`` on the block that ends the longest shared
prefix (so later calls read what this one writes), on the first (the stable head: system text and
question), and on enough between them that every earlier write lies within the ~20 blocks Anthropic
looks back from a breakpoint: at most 4. Prompts below the model's minimum are not cached.

A streamed answer is read by ``debatebus.llm._sse`` with the SDK's headers (paced reads, each
read's events handed on together), its events decoded here with msgspec into the few fields a
turn needs, a read's in one call, rather than by the SDK's stream (httpx, and a pydantic model of
every event). Through a proxy, the SDK's raw streaming response (``with_streaming_response``) is
read instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import msgspec

try:
    import anthropic
    from anthropic.types import (
        AssistantMessageParam,
        MessageParam,
        TextBlockParam,
        UserMessageParam,
    )
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "AnthropicLLM needs the anthropic SDK: pip install 'debatebus[anthropic]'"
    ) from _exc

from debatebus._redaction import redact
from debatebus._usage import TokenUsage
from debatebus.exceptions import ConfigError, LLMError, LLMResponseError
from debatebus.llm._base import LLMRequest, Message
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
from debatebus.llm._structured import Completion

#: Breakpoints Anthropic takes per request, and the blocks it looks back from one for an earlier
#: write (its prompt caching documentation).
_MAX_BREAKPOINTS = 4
_LOOKBACK_BLOCKS = 20
# The shortest prefix each model caches, by model-name prefix; 1024 for the others.
_MIN_CACHEABLE = (
    ("claude-opus-4-5", 4096), ("claude-opus-4-6", 4096), ("claude-haiku-4-5", 4096),
    ("claude-sonnet-4-6", 2048), ("claude-3-5-haiku", 2048), ("claude-3-haiku", 2048),
)


def min_cacheable_tokens(model: str) -> int:
    """The shortest prompt prefix ``model`` caches (tokens); a shorter one is silently not."""
    return next((n for prefix, n in _MIN_CACHEABLE if model.startswith(prefix)), 1024)


def _error_detail(exc: Any) -> str:
    return str(exc.api_message or exc.message)[:DETAIL_LIMIT]


def map_anthropic_error(exc: BaseException, *, model: str, base_url: str) -> ProviderFailure | None:
    """Translate an ``anthropic`` SDK exception into our tree; None for anything else."""
    return map_sdk_error(
        exc, anthropic, anthropic.AnthropicError, _error_detail, model=model, base_url=base_url
    )


def _pieces(message: Message) -> list[tuple[str, bool]]:
    """``message``'s content cut at its breaks: each piece, and whether a shared prefix ends with
    it. A piece without visible text joins the next one (the API refuses blank text blocks)."""
    content = message.content
    cuts = [0]
    for b in message.breaks:
        if cuts[-1] < b < len(content) and content[cuts[-1]:b].strip():
            cuts.append(b)
    shared = set(message.breaks)
    flags = [b in shared for b in (*cuts[1:], len(content))]
    if len(cuts) > 1 and not content[cuts[-1]:].strip():  # a blank tail joins the piece before
        cuts.pop()
        flags[-2:] = [flags[-2] or flags[-1]]
    ends = [*cuts[1:], len(content)]
    return [(content[a:b], flag) for a, b, flag in zip(cuts, ends, flags, strict=True)]


def _breakpoints(candidates: Sequence[int]) -> set[int]:
    """Which of the blocks ending a shared prefix (their indices, ascending) get ``cache_control``:
    the last, then earlier ones so that each lies within the lookback of one, then the first."""
    if not candidates:
        return set()
    chosen = [candidates[-1]]
    for index in reversed(candidates[:-1]):
        if len(chosen) >= _MAX_BREAKPOINTS - 1:
            break
        if chosen[-1] - index >= _LOOKBACK_BLOCKS - 1:
            chosen.append(index)
    if len(chosen) < _MAX_BREAKPOINTS:
        chosen.append(candidates[0])
    return set(chosen)


def _messages(request: LLMRequest, cache: bool) -> list[MessageParam]:
    """The request's messages; with ``cache``, those with breaks as text blocks cut there, with
    ``cache_control`` on the breakpoints ``_breakpoints`` picks."""
    split = [_pieces(m) if cache and m.breaks and m.role == "user" else None
             for m in request.messages]
    candidates, index = [], 0
    for pieces in split:
        for _, shared in pieces or [("", False)]:
            if shared:
                candidates.append(index)
            index += 1
    marked = _breakpoints(candidates)
    out: list[MessageParam] = []
    index = 0
    for message, pieces in zip(request.messages, split, strict=True):
        if message.role == "assistant":
            out.append(AssistantMessageParam(role="assistant", content=message.content))
            index += 1
        elif pieces is None:
            out.append(UserMessageParam(role="user", content=message.content))
            index += 1
        else:
            out.append(UserMessageParam(role="user", content=_blocks(pieces, index, marked)))
            index += len(pieces)
    return out


def _blocks(pieces: list[tuple[str, bool]], first: int,
            marked: set[int]) -> list[TextBlockParam]:
    """Text blocks of ``pieces``, the first at block index ``first``; those ``marked`` carry
    ``cache_control``."""
    blocks: list[TextBlockParam] = []
    for index, (text, _) in enumerate(pieces, first):
        block = TextBlockParam(type="text", text=text)
        if index in marked:
            block["cache_control"] = {"type": "ephemeral"}
        blocks.append(block)
    return blocks



def _count(usage: Any, name: str) -> int:
    value = getattr(usage, name, None)
    return value if isinstance(value, int) else 0


def _usage(message: Any) -> TokenUsage | None:
    usage = getattr(message, "usage", None)
    return _usage_of(usage, getattr(usage, "output_tokens", None))


def _usage_of(usage: Any, answer: object) -> TokenUsage | None:
    """A message's usage (``usage``, the API's, with ``answer`` output tokens) as ours."""
    uncached = getattr(usage, "input_tokens", None)
    if not isinstance(uncached, int) or not isinstance(answer, int):
        return None
    # Anthropic's input_tokens leaves out what was read from or written to the cache: the prompt
    # carried those too (billed at other rates).
    read = _count(usage, "cache_read_input_tokens")
    written = _count(usage, "cache_creation_input_tokens")
    return TokenUsage.of(uncached + read + written, answer, cache_read_tokens=read,
                         cache_write_tokens=written)


class _Usage(msgspec.Struct, gc=False):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class _Started(msgspec.Struct, gc=False):
    usage: _Usage | None = None


class _Delta(msgspec.Struct, gc=False):
    type: str = ""
    text: str = ""


class _Event(msgspec.Struct, gc=False):
    """What a turn reads of a streamed Messages event (other fields are skipped): a text delta
    (``content_block_delta``), the usage of ``message_start`` and ``message_delta``, an
    ``error``."""

    type: str = ""
    delta: _Delta | None = None
    message: _Started | None = None
    usage: _Usage | None = None
    error: Any = None


_EVENT = msgspec.json.Decoder(_Event)
_EVENTS = msgspec.json.Decoder(list[_Event])


def _events(datas: list[bytes], model: str) -> list[_Event]:
    """The events of one read, decoded in one go; an ``LLMResponseError`` naming the one that
    is not an event."""
    try:
        return _EVENTS.decode(b"[" + b",".join(datas) + b"]")
    except msgspec.DecodeError:
        for data in datas:
            try:
                _EVENT.decode(data)
            except msgspec.DecodeError as exc:
                raise LLMResponseError(
                    f"{model}: malformed stream event {data[:200].decode(errors='replace')!r}: "
                    f"{exc}") from exc
        raise


class _EventBatches:
    """A streaming response's events read by ``debatebus.llm._sse``, decoded, a batch per read,
    up to ``message_stop``; once ``message_delta`` says the answer is written, the rest is read as
    it comes (``EventSource.hurry``)."""

    def __init__(self, source: EventSource, model: str) -> None:
        self._source = source
        self._model = model

    async def __aiter__(self) -> AsyncIterator[list[_Event]]:
        async for datas in self._source.batches():
            events = _events(datas, self._model)
            last = events[-1].type
            if last == "message_delta":
                self._source.hurry()
            yield events
            if last == "message_stop":
                return

    async def close(self) -> None:
        self._source.close()


class _EventStream:
    """The same through the SDK's raw streaming response (a proxied server), an event at a
    time."""

    def __init__(self, response: Any, model: str) -> None:
        self._response = response
        self._model = model

    async def __aiter__(self) -> AsyncIterator[list[_Event]]:
        async for data in data_lines(self._response):
            events = _events([data], self._model)
            yield events
            if events[-1].type == "message_stop":
                return

    async def close(self) -> None:
        await self._response.close()


class _EventReader:
    """A streamed message's events: the text of its text deltas, the input tokens its start
    reports and the output tokens its last ``message_delta`` counts."""

    __slots__ = ("_output", "_start", "model")

    def __init__(self, model: str) -> None:
        self.model = model
        self._start: _Usage | None = None  # the usage message_start reports
        self._output: int | None = None

    def feed(self, events: Sequence[_Event]) -> str:
        parts = []
        for event in events:
            kind = event.type
            if kind == "content_block_delta":
                if (delta := event.delta) is not None and delta.type == "text_delta":
                    parts.append(delta.text)
            elif kind == "message_start" and event.message is not None:
                self._start = event.message.usage
                self._output = None if self._start is None else self._start.output_tokens
            elif kind == "message_delta" and event.usage is not None:
                if event.usage.output_tokens is not None:
                    self._output = event.usage.output_tokens
            elif kind == "error":  # a server's error after the stream began (overloaded…)
                error = event.error
                said = error.get("message", error) if isinstance(error, dict) else error
                raise LLMError(f"{self.model}: the server reported an error: "
                               f"{str(said)[:DETAIL_LIMIT]}")
        return "".join(parts)

    @property
    def usage(self) -> TokenUsage | None:
        return None if self._start is None else _usage_of(self._start, self._output)


def _to_completion(message: Any, model: str) -> Completion:
    content = getattr(message, "content", None)
    if not isinstance(content, list):
        raise LLMResponseError(f"{model}: malformed response without content: {message!r:.300}")
    text = "".join(
        block.text for block in content if getattr(block, "type", None) == "text" and block.text
    )
    return Completion(text, _usage(message), message)


class AnthropicLLM(SDKProvider[anthropic.AsyncAnthropic]):
    """A Claude model (or any server speaking the Messages API at ``base_url``).

    The key comes from ``api_key`` or the SDK's usual sources (``ANTHROPIC_API_KEY``…); a server
    that is not a paid provider gets a placeholder when none is set, and a paid one with none is a
    ``ConfigError`` here, not a failure on every call. ``temperature`` is sent as an
    extra body field because recent SDKs no longer list it. ``timeout`` bounds one attempt,
    ``total_timeout`` one call over all its attempts and waits. ``retry_policy``, when given,
    replaces the policy built from ``timeout``, ``total_timeout`` and ``max_retries``.
    ``prompt_caching``: mark the debate's shared prefixes with ``cache_control`` (the module's
    docstring says where); off for a Messages-compatible server that refuses the field.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        total_timeout: float | None = DEFAULT_TOTAL_TIMEOUT,
        max_retries: int = 3,
        max_tokens: int = 1024,
        temperature: float | None = None,
        retry_policy: RetryPolicy | None = None,
        prompt_caching: bool = True,
    ) -> None:
        if not model:
            raise ConfigError("AnthropicLLM needs a model name, e.g. 'claude-3-5-haiku-latest'")
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, not {max_tokens}")
        key = api_key_or_placeholder(
            api_key,
            key_env="ANTHROPIC_API_KEY",
            base_url=base_url,
            base_url_env="ANTHROPIC_BASE_URL",
        )
        try:
            client = anthropic.AsyncAnthropic(
                api_key=key, base_url=base_url, timeout=timeout, max_retries=0
            )
        except (anthropic.AnthropicError, ValueError) as exc:
            raise ConfigError(redact(f"{model}: {exc}", [key])) from None
        # The SDK starts without credentials and fails each call with a TypeError; refuse here.
        # ``credentials`` (profiles, workload identity) exists on newer SDKs only.
        if (client.api_key is None and client.auth_token is None
                and getattr(client, "credentials", None) is None):
            raise ConfigError(f"{model}: no API key for {redact(str(client.base_url))}: "
                              f"{key_hint('ANTHROPIC_API_KEY')}")
        super().__init__(
            model,
            client,
            api_key=key,
            map_error=map_anthropic_error,
            timeout=timeout,
            total_timeout=total_timeout,
            max_retries=max_retries,
            retry_policy=retry_policy,
        )
        self._max_tokens = max_tokens
        self._temperature = temperature
        self._caching = prompt_caching
        self._min_cacheable = min_cacheable_tokens(model)

    def _body(self, request: LLMRequest) -> dict[str, Any]:
        """The Messages API's fields for ``request``, as sent on the wire."""
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": request.max_tokens or self._max_tokens,
            "messages": _messages(request, self._caching),
        }
        if request.system:
            body["system"] = request.system
        if request.stop:
            body["stop_sequences"] = list(request.stop)
        if self._temperature is not None:
            body["temperature"] = self._temperature
        return body

    def _params(self, request: LLMRequest) -> dict[str, Any]:
        """The same as the SDK's keywords: ``temperature`` as an extra body field."""
        params = self._body(request)
        temperature = params.pop("temperature", None)
        return {**params, "extra_body": None if temperature is None
                else {"temperature": temperature}}

    async def _send(self, request: LLMRequest) -> Completion:
        params = self._params(request)

        async def attempt() -> Completion:
            message = await self._client.messages.create(**params)
            return _to_completion(message, self._model)

        answer = await self._with_retries(attempt)
        self._note_usage(request, answer.usage)
        return answer

    def _note_usage(self, request: LLMRequest, usage: TokenUsage | None) -> None:
        if self._caching and usage is not None and any(m.breaks for m in request.messages):
            self._note_too_short_to_cache(usage.prompt_tokens, self._min_cacheable)

    async def _open_stream(self, request: LLMRequest, interval_s: float) -> SDKStream:
        if self._proxied:
            # Entered here, closed by the stream: an error status is raised on entering.
            response = await self._client.messages.with_streaming_response.create(
                **self._params(request), stream=True).__aenter__()
            return _EventStream(response, self._model)
        source = await self._open_events("/v1/messages", {**self._body(request), "stream": True},
                                         interval_s)
        return _EventBatches(source, self._model)

    def _sdk_headers(self) -> Mapping[str, object]:
        return {**self._client.default_headers, **self._client.auth_headers}

    def _stream_reader(self) -> _EventReader:
        return _EventReader(self._model)
