"""``AnthropicLLM``: Claude through the official SDK's Messages API.

Structured output (judges) uses the same path as every other provider — the schema in the system
prompt, the first JSON object extracted from the answer, validation, one repair — because it works
on every Claude model and every Messages-compatible proxy.
"""

from __future__ import annotations

from typing import Any

try:
    import anthropic
    from anthropic.types import AssistantMessageParam, MessageParam, UserMessageParam
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "AnthropicLLM needs the anthropic SDK: pip install 'debatebus[anthropic]'"
    ) from _exc

from debatebus.exceptions import ConfigError, LLMResponseError
from debatebus.llm.base import LLMRequest
from debatebus.llm.provider import (
    DETAIL_LIMIT,
    SDKProvider,
    SDKStream,
    api_key_or_placeholder,
    key_hint,
)
from debatebus.llm.retry import (
    DEFAULT_TIMEOUT,
    DEFAULT_TOTAL_TIMEOUT,
    ProviderFailure,
    RetryPolicy,
    map_sdk_error,
)
from debatebus.llm.structured import Completion
from debatebus.redaction import redact
from debatebus.schemas.usage import TokenUsage

__all__ = ["AnthropicLLM", "map_anthropic_error"]


def _error_detail(exc: Any) -> str:
    return str(exc.api_message or exc.message)[:DETAIL_LIMIT]


def map_anthropic_error(exc: BaseException, *, model: str, base_url: str) -> ProviderFailure | None:
    """Translate an ``anthropic`` SDK exception into our tree; None for anything else."""
    return map_sdk_error(
        exc, anthropic, anthropic.AnthropicError, _error_detail, model=model, base_url=base_url
    )


def _messages(request: LLMRequest) -> list[MessageParam]:
    return [
        AssistantMessageParam(role="assistant", content=message.content)
        if message.role == "assistant"
        else UserMessageParam(role="user", content=message.content)
        for message in request.messages
    ]


def _usage(message: Any) -> TokenUsage | None:
    usage = getattr(message, "usage", None)
    prompt = _input_tokens(usage)
    answer = getattr(usage, "output_tokens", None)
    if prompt is None or not isinstance(answer, int):
        return None
    return TokenUsage.of(prompt, answer)


def _input_tokens(usage: Any) -> int | None:
    prompt = getattr(usage, "input_tokens", None)
    if not isinstance(prompt, int):
        return None
    # Cached input is still input the prompt carried (and is billed, at another rate).
    for name in ("cache_creation_input_tokens", "cache_read_input_tokens"):
        cached = getattr(usage, name, None)
        prompt += cached if isinstance(cached, int) else 0
    return prompt


class _EventReader:
    """A streamed message's events: the text of its text deltas, the input tokens its start
    reports and the output tokens its last ``message_delta`` counts."""

    __slots__ = ("_input", "_output")

    def __init__(self) -> None:
        self._input: int | None = None
        self._output: int | None = None

    def feed(self, event: Any) -> str:
        kind = event.type
        if kind == "content_block_delta":
            return event.delta.text if event.delta.type == "text_delta" else ""
        if kind == "message_start":
            self._input = _input_tokens(event.message.usage)
            self._output = getattr(event.message.usage, "output_tokens", None)
        elif kind == "message_delta":
            self._output = getattr(event.usage, "output_tokens", self._output)
        return ""

    @property
    def usage(self) -> TokenUsage | None:
        if self._input is None or not isinstance(self._output, int):
            return None
        return TokenUsage.of(self._input, self._output)


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

    def _params(self, request: LLMRequest) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self._temperature is not None:
            extra["temperature"] = self._temperature
        return {
            "model": self._model,
            "max_tokens": request.max_tokens or self._max_tokens,
            "messages": _messages(request),
            "system": request.system or anthropic.omit,
            "stop_sequences": list(request.stop) or anthropic.omit,
            "extra_body": extra or None,
        }

    async def _send(self, request: LLMRequest) -> Completion:
        params = self._params(request)

        async def attempt() -> Completion:
            message = await self._client.messages.create(**params)
            return _to_completion(message, self._model)

        return await self._with_retries(attempt)

    async def _open_stream(self, request: LLMRequest) -> SDKStream:
        stream: SDKStream = await self._client.messages.create(**self._params(request),
                                                                stream=True)
        return stream

    def _stream_reader(self) -> _EventReader:
        return _EventReader()
