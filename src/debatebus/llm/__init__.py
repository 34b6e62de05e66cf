"""LLM interface, shipped fakes and (optional) real providers.

The providers load lazily (``from debatebus.llm import OpenAICompatibleLLM`` imports the openai
SDK only then), so each stays an optional extra.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from debatebus.llm.base import LLM, LLMRequest, LLMResponse, LLMStream, Message, model_name
from debatebus.llm.fakes import FunctionLLM, ScriptedLLM
from debatebus.llm.ratelimit import (
    MemoryRateLimiter,
    RateLimit,
    RateLimitedLLM,
    RateLimiter,
    with_rate_limits,
)
from debatebus.llm.spend import MemorySpendLimiter, SpendLimit, SpendLimitedLLM, SpendLimiter

if TYPE_CHECKING:
    from debatebus.llm.anthropic_llm import AnthropicLLM
    from debatebus.llm.local import LocalLLM
    from debatebus.llm.openai_compat import OpenAICompatibleLLM
    from debatebus.llm.ratelimit_redis import RedisRateLimiter, RedisSpendLimiter
    from debatebus.llm.registry import resolve_llm

__all__ = [
    "ALLOW_MODEL_REQUESTS",
    "LLM",
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
    "RateLimit",
    "RateLimitedLLM",
    "RateLimiter",
    "RedisRateLimiter",
    "RedisSpendLimiter",
    "ScriptedLLM",
    "SpendLimit",
    "SpendLimitedLLM",
    "SpendLimiter",
    "model_name",
    "resolve_llm",
    "with_rate_limits",
]

ALLOW_MODEL_REQUESTS = True
"""When False, providers refuse to call a paid endpoint (api.openai.com, api.anthropic.com) and
raise ``ModelRequestsNotAllowedError`` before any network traffic. Read at call time; test suites
set it to False. Loopback servers are always allowed."""

_LAZY = {
    "OpenAICompatibleLLM": "debatebus.llm.openai_compat",
    "AnthropicLLM": "debatebus.llm.anthropic_llm",
    "LocalLLM": "debatebus.llm.local",
    "RedisRateLimiter": "debatebus.llm.ratelimit_redis",
    "RedisSpendLimiter": "debatebus.llm.ratelimit_redis",
    "resolve_llm": "debatebus.llm.registry",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
