"""LLM interface, shipped fakes and (optional) real providers, and the ``ALLOW_MODEL_REQUESTS``
switch with the paid-provider test it guards.

The providers load lazily (``from debatebus.llm import OpenAICompatibleLLM`` imports the openai
SDK only then), so each stays an optional extra.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from debatebus._pricing import DEFAULT_PRICES, Price, Prices
from debatebus._usage import TokenUsage
from debatebus.exceptions import ModelRequestsNotAllowedError
from debatebus.llm._base import LLM, LLMRequest, LLMResponse, LLMStream, Message, model_name
from debatebus.llm._fakes import FunctionLLM, ScriptedLLM
from debatebus.llm._rate_limits import with_rate_limits
from debatebus.llm._ratelimit import (
    MemoryRateLimiter,
    RateLimit,
    RateLimitedLLM,
    RateLimiter,
)
from debatebus.llm._spend import MemorySpendLimiter, SpendLimit, SpendLimitedLLM, SpendLimiter

if TYPE_CHECKING:
    from debatebus.llm._anthropic_llm import AnthropicLLM
    from debatebus.llm._local import LocalLLM
    from debatebus.llm._openai_compat import OpenAICompatibleLLM
    from debatebus.llm._ratelimit_redis import RedisRateLimiter, RedisSpendLimiter
    from debatebus.llm._registry import resolve_llm

__all__ = [
    "ALLOW_MODEL_REQUESTS",
    "DEFAULT_PRICES",
    "LLM",
    "PAID_HOST_SUFFIXES",
    "AnthropicLLM",
    "FunctionLLM",
    "LLMRequest",
    "LLMResponse",
    "LLMStream",
    "LocalLLM",
    "MemoryRateLimiter",
    "MemorySpendLimiter",
    "Message",
    "OpenAICompatibleLLM",
    "Price",
    "Prices",
    "RateLimit",
    "RateLimitedLLM",
    "RateLimiter",
    "RedisRateLimiter",
    "RedisSpendLimiter",
    "ScriptedLLM",
    "SpendLimit",
    "SpendLimitedLLM",
    "SpendLimiter",
    "TokenUsage",
    "check_model_requests_allowed",
    "is_loopback_url",
    "is_paid_url",
    "model_name",
    "model_requests_allowed",
    "override_allow_model_requests",
    "resolve_llm",
    "with_rate_limits",
]

ALLOW_MODEL_REQUESTS = True
"""When False, providers refuse to call a paid endpoint (api.openai.com, api.anthropic.com) and
raise ``ModelRequestsNotAllowedError`` before any network traffic. Read at call time; test suites
set it to False. Loopback servers are always allowed."""

# Hosts that bill per token. A base_url of None means the SDK's default, which is one of these.
PAID_HOST_SUFFIXES = ("openai.com", "anthropic.com")


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower().rstrip(".")


def is_loopback_url(url: str) -> bool:
    host = _host(url)
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_paid_url(url: str | None) -> bool:
    """True for api.openai.com, api.anthropic.com (and their subdomains) and for None."""
    if url is None:
        return True
    if is_loopback_url(url):
        return False
    host = _host(url)
    return any(host == suffix or host.endswith("." + suffix) for suffix in PAID_HOST_SUFFIXES)


def model_requests_allowed() -> bool:
    """``ALLOW_MODEL_REQUESTS`` as it is now (assigned on this module, read at call time)."""
    return bool(ALLOW_MODEL_REQUESTS)


def check_model_requests_allowed(model: str, base_url: str | None) -> None:
    """Raise before any network traffic when a paid provider is called with requests disallowed."""
    if is_paid_url(base_url) and not model_requests_allowed():
        where = _host(base_url) if base_url else "the provider's default endpoint"
        raise ModelRequestsNotAllowedError(
            f"{model}: requests to {where} are blocked because "
            "debatebus.llm.ALLOW_MODEL_REQUESTS is False (tests turn it off so that no test can "
            "reach a paid provider); point base_url at a local server or set it to True"
        )


@contextmanager
def override_allow_model_requests(allow: bool) -> Iterator[None]:
    """Temporarily set ``debatebus.llm.ALLOW_MODEL_REQUESTS``."""
    global ALLOW_MODEL_REQUESTS  # the switch is this module's attribute: what a conftest assigns
    previous = ALLOW_MODEL_REQUESTS
    ALLOW_MODEL_REQUESTS = allow
    try:
        yield
    finally:
        ALLOW_MODEL_REQUESTS = previous


_LAZY = {
    "OpenAICompatibleLLM": "debatebus.llm._openai_compat",
    "AnthropicLLM": "debatebus.llm._anthropic_llm",
    "LocalLLM": "debatebus.llm._local",
    "RedisRateLimiter": "debatebus.llm._ratelimit_redis",
    "RedisSpendLimiter": "debatebus.llm._ratelimit_redis",
    "resolve_llm": "debatebus.llm._registry",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
