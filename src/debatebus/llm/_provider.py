"""What the SDK-backed providers share, so that they differ only in how one call is made.

Every provider sends through the same retry policy and redaction (``retry.py``), is blocked the
same way from paid endpoints when requests are disallowed, and validates structured answers the
same way (``structured.py``). They stream the same way too (``stream``): the server's stream
opened under the retry policy, then read by ``debatebus.llm._sse`` a batch of events at a time
(through a proxy, the SDK's raw stream, an event at a time), an error once it is open being final. This
module imports no SDK: loading one provider must not load the other's.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import os
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from functools import partial
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

import msgspec

from debatebus._redaction import redact, url_secrets
from debatebus._usage import TokenUsage
from debatebus.exceptions import LLMError, LLMTimeoutError
from debatebus.llm import check_model_requests_allowed, is_paid_url
from debatebus.llm._base import LLM, LLMRequest, LLMResponse, LLMStream, Piece
from debatebus.llm._retry import (
    Classifier,
    ProviderFailure,
    Redactor,
    RetryPolicy,
    call_with_retries,
    failure_for_status,
)
from debatebus.llm._sse import EventSource, HTTPStatusError, open_events, proxied
from debatebus.llm._structured import Completion, complete_structured, with_json_instructions

log = logging.getLogger("debatebus.llm")

#: Headers ``debatebus.llm._sse`` sets itself (lower case).
_OWN_HEADERS = frozenset({"accept", "accept-encoding", "connection", "content-type",
                          "content-length", "host"})
_encode = msgspec.json.Encoder().encode


def _error_detail(body: str) -> str:
    """What an error response's body says: its ``error.message`` (OpenAI's and Anthropic's
    shape), else the body itself; cut to ``DETAIL_LIMIT``."""
    try:
        said = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body[:DETAIL_LIMIT]
    error = said.get("error") if isinstance(said, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message if message is not None else body)[:DETAIL_LIMIT]


# Local servers ignore the key, but the SDKs refuse to start without one.
_PLACEHOLDER_KEY = "not-needed"
DETAIL_LIMIT = 300  # characters of a server's own error message quoted in ours


def api_key_or_placeholder(
    api_key: str | None, *, key_env: str, base_url: str | None, base_url_env: str
) -> str | None:
    """``api_key``, else ``$key_env``; else a placeholder unless the server bills per token."""
    key = api_key or os.environ.get(key_env)
    if not key and not is_paid_url(base_url or os.environ.get(base_url_env)):
        key = _PLACEHOLDER_KEY
    return key


def key_hint(key_env: str) -> str:
    """How to give a provider its key, in words that redaction leaves as they are."""
    return f"set {key_env} or pass api_key=..."


class ErrorMap(Protocol):
    """A provider's SDK exception → ``ProviderFailure`` translation (None: not the SDK's)."""

    def __call__(
        self, exc: BaseException, *, model: str, base_url: str
    ) -> ProviderFailure | None: ...


async def data_lines(response: Any) -> AsyncIterator[bytes]:
    """The ``data`` of each server-sent event of an SDK's raw streaming response
    (``with_streaming_response``), read a line at a time: the path through a proxy."""
    async for line in response.iter_lines():
        if line.startswith("data:"):  # not blank separators, comments, event names
            yield line[5:].strip().encode()


class _Client(Protocol):
    @property
    def base_url(self) -> object: ...

    async def close(self) -> None: ...


ClientT = TypeVar("ClientT", bound=_Client)


class SDKStream(Protocol):
    """A streaming call's server-sent events, decoded, in batches: the events that arrived
    together (one read of the connection)."""

    def __aiter__(self) -> AsyncIterator[Sequence[Any]]: ...

    async def close(self) -> None: ...


class StreamReader(Protocol):
    """Reads one call's stream events, a batch at a time: the text a batch adds, and the usage
    they reported."""

    def feed(self, batch: Sequence[Any]) -> str: ...

    @property
    def usage(self) -> TokenUsage | None: ...


class SDKProvider(LLM, abc.ABC, Generic[ClientT]):
    """A model behind an SDK client. Subclasses build the client and implement ``_send``.

    The SDK's own retries must be off (``max_retries=0``) so that ``retry_policy`` — or the one
    built from ``timeout``, ``total_timeout`` and ``max_retries`` — governs every call.
    """

    def __init__(
        self,
        model: str,
        client: ClientT,
        *,
        api_key: str | None,
        map_error: ErrorMap,
        timeout: float,
        total_timeout: float | None,
        max_retries: int,
        retry_policy: RetryPolicy | None,
    ) -> None:
        self._client = client
        self._model = model
        # The SDK's, not the argument: it applies the SDK's default and its environment variable.
        self._base_url = str(client.base_url)
        # The key and the URL's password and secret query values, wherever an SDK prints them.
        self._redact = Redactor([api_key, *url_secrets(self._base_url)])
        self._policy = retry_policy or RetryPolicy(
            max_retries=max_retries, timeout=timeout, total_timeout=total_timeout
        )
        # Errors name the server by its redacted URL: they end up in events, results and stores.
        self._shown_url = redact(self._base_url)
        self._classify: Classifier = partial(map_error, model=model, base_url=self._shown_url)
        self._said_too_short = False  # said once that a prompt was too short to cache
        # Whether calls go through a proxy (the environment's, read once, as the SDK's client
        # reads it): ``debatebus.llm._sse`` does not speak to one, so a streaming call is the SDK's.
        self._proxied = proxied(self._base_url)

    @property
    def model(self) -> str:
        return self._model

    @property
    def base_url(self) -> str:
        return self._base_url

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self._model!r}, base_url={self._shown_url!r})"

    async def aclose(self) -> None:
        await self._client.close()

    async def complete(self, request: LLMRequest) -> LLMResponse:
        check_model_requests_allowed(self._model, self._base_url)
        if request.response_schema is None:
            answer = await self._send(request)
            return LLMResponse(answer.text, None, answer.usage, self._model, answer.raw)
        return await complete_structured(
            request, self._send_structured, model=self._model, redact=self._redact
        )

    def stream(self, request: LLMRequest, *, interval_s: float = 0.0) -> LLMStream:
        """The answer as the server writes it, the connection read at the ticks of ``interval_s``
        (``debatebus.llm._sse``; through a proxy, the SDK's stream, read as it comes). A request
        with a ``response_schema`` is answered by ``complete`` in one piece: structured output is
        checked (and repaired) whole."""
        if request.response_schema is not None:
            return super().stream(request)
        return LLMStream(self._streamed(request, interval_s))

    async def _streamed(self, request: LLMRequest,
                        interval_s: float) -> AsyncGenerator[Piece, None]:
        """Open the stream under the retry policy (a call the server refuses, or cannot be
        reached for, is retried like ``complete``'s), then hand on its text, what each read
        brought as one piece; a failure once the stream is open is final: its text may have been
        handed on already. The whole call stays within ``total_timeout``; ``timeout`` bounds
        each wait for the server."""
        check_model_requests_allowed(self._model, self._base_url)
        total = self._policy.total_timeout
        loop = asyncio.get_running_loop()
        deadline = None if total is None else loop.time() + total
        events: SDKStream = await call_with_retries(
            lambda: self._open_stream(request, interval_s), model=self._model,
            policy=self._policy, classify=self._classify_stream, redactor=self._redact)
        reader = self._stream_reader()
        parts: list[str] = []
        try:
            async for batch in events:
                text = reader.feed(batch)
                if text:
                    parts.append(text)
                    yield text
                if deadline is not None and loop.time() > deadline:
                    raise LLMTimeoutError(f"{self._model}: the answer was still being written "
                                          f"after total_timeout={total:g}s")
        except LLMError as exc:
            self._redact.scrub(exc)
            raise
        except Exception as exc:
            raise self._broken_off(exc) from exc
        finally:
            await events.close()
        usage = reader.usage
        self._note_usage(request, usage)
        yield LLMResponse("".join(parts), None, usage, self._model)

    def _broken_off(self, exc: Exception) -> LLMError:
        """What a failure while the answer streamed is raised as: the SDK's error as
        ``complete`` maps it (its class kept: a rate limit stays one), or an ``LLMError`` for
        one the SDK passes on unmapped, said to have broken the stream off; secrets masked."""
        failure = self._classify_stream(exc)
        error = failure.error if failure is not None else LLMError(f"{type(exc).__name__}: {exc}")
        said = str(error).removeprefix(f"{self._model}: ")
        error.args = (self._redact(f"{self._model}: the answer's stream from {self._shown_url} "
                                   f"broke off: {said}"),)
        self._redact.scrub(exc)
        return error

    @abc.abstractmethod
    async def _send(self, request: LLMRequest) -> Completion:
        """One request as the SDK call, retried through ``_with_retries``."""

    @abc.abstractmethod
    async def _open_stream(self, request: LLMRequest, interval_s: float) -> SDKStream:
        """One request as a streaming call, opened (retried by ``stream``): through
        ``_open_events`` unless ``_proxied``."""

    async def _open_events(self, path: str, body: Mapping[str, Any],
                           interval_s: float) -> EventSource:
        """``body`` posted to ``path`` under the base URL, with the SDK's headers (its key
        among them), its answer's events read by ``debatebus.llm._sse``."""
        base = urlsplit(self._base_url)
        url = urlunsplit(base._replace(path=base.path.rstrip("/") + path))
        headers = {name: value for name, value in self._sdk_headers().items()
                   if isinstance(value, str) and name.lower() not in _OWN_HEADERS}
        return await open_events(url, headers, _encode(body), timeout=self._policy.timeout,
                                 interval_s=interval_s)

    @abc.abstractmethod
    def _sdk_headers(self) -> Mapping[str, object]:
        """The headers the SDK sends with each request (its key among them)."""

    def _classify_stream(self, exc: BaseException) -> ProviderFailure | None:
        """``_classify``, and what ``debatebus.llm._sse`` raises mapped as the SDK's errors are: a
        status by ``failure_for_status``, a connection that failed as one that cannot reach the
        server, a wait past ``timeout`` as a timeout (each retried while the stream opens)."""
        if isinstance(exc, HTTPStatusError):
            return failure_for_status(self._model, exc.status, _error_detail(exc.body), exc,
                                      exc.headers)
        if isinstance(exc, TimeoutError):
            return ProviderFailure(LLMTimeoutError(
                f"{self._model}: request to {self._shown_url} timed out"), exc, True)
        if isinstance(exc, OSError):
            return ProviderFailure(LLMError(
                f"{self._model}: cannot reach {self._shown_url}: {exc}"), exc, True)
        return self._classify(exc)

    @abc.abstractmethod
    def _stream_reader(self) -> StreamReader:
        """A reader for one streaming call's events."""

    async def _send_structured(self, request: LLMRequest) -> Completion:
        # The schema in the system prompt works on every model and every compatible proxy;
        # providers with a native JSON mode override this to use it as well.
        schema = request.response_schema
        assert schema is not None
        return await self._send(with_json_instructions(request, schema))

    def _note_usage(self, request: LLMRequest, usage: TokenUsage | None) -> None:
        """What a provider notes of an answer's ``usage``, streamed or not (by default nothing)."""

    def _note_too_short_to_cache(self, prompt_tokens: int, minimum: int) -> None:
        """Say once, in the debug log, that a prompt of ``prompt_tokens`` is below ``minimum``, the
        shortest prefix the provider caches: nothing of it was cached, and no error says so."""
        if prompt_tokens >= minimum or self._said_too_short:
            return
        self._said_too_short = True
        log.debug("%s: a prompt of %d tokens is below the %d tokens %s caches at least, so "
                  "nothing of it is cached (a debate's later, longer prompts are); said once",
                  self._model, prompt_tokens, minimum, self._shown_url)

    async def _with_retries(
        self, attempt: Callable[[], Awaitable[Completion]], classify: Classifier | None = None
    ) -> Completion:
        return await call_with_retries(
            attempt,
            model=self._model,
            policy=self._policy,
            classify=classify or self._classify,
            redactor=self._redact,
        )
