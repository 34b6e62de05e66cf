"""One exception tree for everything debatebus raises, split by who must act.

Callers catch these, never ``redis``, ``aiokafka``, ``openai`` or ``anthropic`` errors: every adapter
translates its backend's exceptions at the boundary and keeps the original as ``__cause__``.
"""

from __future__ import annotations

from typing import Literal

from debatebus._usage import TokenUsage

__all__ = [
    "BudgetExceededError",
    "BudgetLimit",
    "CheckpointMissingError",
    "ConfigError",
    "DebatebusError",
    "DriftError",
    "InputError",
    "LLMError",
    "LLMRateLimitError",
    "LLMResponseError",
    "LLMTimeoutError",
    "LeaseLostError",
    "MessageTooLargeError",
    "ModelRequestsNotAllowedError",
    "NotSupportedError",
    "ScriptExhaustedError",
    "SpendLimitError",
    "TransportError",
]

#: Which limit of a debate's ``Budget`` was reached.
BudgetLimit = Literal["max_calls", "max_total_tokens", "max_cost"]


class DebatebusError(Exception):
    """Base of every error debatebus raises."""


class ConfigError(DebatebusError, ValueError):
    """The library is being misused: the message says which argument to change and how."""


class CheckpointMissingError(ConfigError):
    """An append found no checkpoint to append to: it was never begun, the debate's result
    replaced it, or the store lost it (a Redis restarted without its data)."""


class NotSupportedError(ConfigError):
    """The transport cannot do what was asked (e.g. replay on Redis pub/sub, which keeps no
    history): use a transport that can."""


class InputError(DebatebusError, ValueError):
    """A request on the bus is malformed: the producer must fix what it publishes."""


class TransportError(DebatebusError):
    """The broker failed or could not be reached: operators must act (or a retry may help)."""


class MessageTooLargeError(TransportError):
    """The broker refused a message as too large. ``size`` is the message's size in bytes and
    ``limit`` the broker's (or the transport's configured) maximum."""

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class DriftError(DebatebusError):
    """A checkpointed debate's definition changed between the run that wrote it and this one."""


class LeaseLostError(DebatebusError):
    """This worker's lease on a debate expired and another worker may have taken it over: the run
    stopped without publishing, and the worker released the request unsettled, so the broker
    hands it out again (Redis Streams: to any consumer after ``claim_idle_ms``; Kafka: from the
    same consumer at once)."""


class LLMError(DebatebusError):
    """A model call failed. ``usage`` holds tokens the provider charged before failing, if any."""

    def __init__(self, message: str, *, usage: TokenUsage | None = None) -> None:
        super().__init__(message)
        self.usage = usage


class LLMTimeoutError(LLMError):
    """The model did not answer within the per-call timeout or the debate's deadline."""


class LLMRateLimitError(LLMError):
    """The provider kept refusing with a rate limit after every retry."""


class LLMResponseError(LLMError):
    """The model answered, but not in the shape asked for (e.g. a verdict that does not validate)."""


class ScriptExhaustedError(LLMError):
    """A ScriptedLLM was called more times than it has scripted responses."""


class ModelRequestsNotAllowedError(LLMError):
    """A paid provider was called while ``debatebus.llm.ALLOW_MODEL_REQUESTS`` is False."""


class BudgetExceededError(LLMError):
    """The next call would exceed the debate's ``Budget``: ``limit`` names which of its limits.
    Running the debate again meets the same budget: its failure is final."""

    def __init__(self, message: str, *, limit: BudgetLimit,
                 usage: TokenUsage | None = None) -> None:
        super().__init__(message, usage=usage)
        self.limit: BudgetLimit = limit


class SpendLimitError(LLMError):
    """A fleet-wide spend limit (``debatebus.llm._spend``) is reached for its current window: the
    call was not made. Unlike a debate's budget, this passes: the debate fails as retryable, and a
    resend or ``debatebus replay --failed`` after ``retry_after_s`` runs it again."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
