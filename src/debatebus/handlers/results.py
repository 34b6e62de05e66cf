"""The result document a debate handler returns and the worker publishes.

Field names follow Synkro's ``asHandler`` where they overlap (``debateOutput``, ``debateSynthesis``,
``debateRounds``, ``debateStatus``, ``debateTokenUsage``) so Synkro consumers can read our results.
"""

from __future__ import annotations

from typing import Any

import msgspec
from pydantic import BaseModel

from debatebus.engine.result import DebateResult
from debatebus.redaction import redact

__all__ = [
    "failure_fields",
    "result_fields",
    "to_builtins",
]


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def to_builtins(value: Any) -> Any:
    """Plain JSON-ready data (dicts, lists, str…) from structs and pydantic verdicts."""
    return msgspec.to_builtins(value, enc_hook=_enc_hook)


def result_fields(result: DebateResult) -> dict[str, Any]:
    """The result fields of a debate that ran (``debateReplayed`` is false: a stored or shared
    result is marked where it is replayed); its error is redacted like ``failure_fields``'."""
    usage = result.token_usage
    return {
        "debateId": result.debate_id,
        "debateOutput": result.output,
        "debateSynthesis": result.synthesis,
        "debateRounds": len(result.rounds),
        "debateStatus": result.status,
        "debateTokenUsage": {
            "promptTokens": usage.prompt_tokens,
            "completionTokens": usage.completion_tokens,
            "totalTokens": usage.total_tokens,
        },
        "debateTranscript": to_builtins(result.rounds),
        "debateVerdict": to_builtins(result.verdict),
        "debatePhiHat": result.phi_hat,
        "debateSatisfied": result.satisfied,
        "debateError": redact(result.error) if result.error else result.error,
        "debateReplayed": False,
    }


def failure_fields(debate_id: str, error: str) -> dict[str, Any]:
    """The result fields of a request that failed before any debate ran (bad input, drift…).

    ``error`` is redacted here as a safety net: providers already mask the secrets in their errors,
    but this text is published, stored and shown to whoever reads the results."""
    return {
        "debateId": debate_id,
        "debateOutput": "",
        "debateSynthesis": None,
        "debateRounds": 0,
        "debateStatus": "failed",
        "debateTokenUsage": {"promptTokens": 0, "completionTokens": 0, "totalTokens": 0},
        "debateError": redact(error),
        "debateReplayed": False,
    }
