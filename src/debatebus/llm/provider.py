"""What the SDK-backed providers share, so that they differ only in how one call is made.

Every provider sends through the same retry policy and redaction (``retry.py``), is blocked the
same way from paid endpoints when requests are disallowed, and validates structured answers the
same way (``structured.py``). This module imports no SDK: loading one provider must not load the
other's.
"""

from __future__ import annotations

import abc
import logging
import os
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Generic, Protocol, TypeVar

from debatebus.llm import check_model_requests_allowed, is_paid_url
from debatebus.llm.base import LLMRequest, LLMResponse
from debatebus.llm.retry import (
    Classifier,
    ProviderFailure,
    Redactor,
    RetryPolicy,
    call_with_retries,
)
from debatebus.llm.structured import Completion, complete_structured, with_json_instructions
from debatebus.redaction import redact, url_secrets

__all__ = ["DETAIL_LIMIT", "ErrorMap", "SDKProvider", "api_key_or_placeholder", "key_hint"]

log = logging.getLogger("debatebus.llm")

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


class _Client(Protocol):
    @property
    def base_url(self) -> object: ...

    async def close(self) -> None: ...


ClientT = TypeVar("ClientT", bound=_Client)


class SDKProvider(abc.ABC, Generic[ClientT]):
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

    @abc.abstractmethod
    async def _send(self, request: LLMRequest) -> Completion:
        """One request as the SDK call, retried through ``_with_retries``."""

    async def _send_structured(self, request: LLMRequest) -> Completion:
        # The schema in the system prompt works on every model and every compatible proxy;
        # providers with a native JSON mode override this to use it as well.
        schema = request.response_schema
        assert schema is not None
        return await self._send(with_json_instructions(request, schema))

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
