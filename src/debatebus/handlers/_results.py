"""The result document a debate handler returns and the worker publishes: built here only.

``result_fields`` (a debate that ran), ``failure_fields`` (one that could not run) and
``fork_fields`` are its ``debate*`` fields; ``answer`` merges them with the request's payload into
the ``HandlerResult`` a handler returns, and ``failure_result`` does the same for a request that
failed before or instead of a debate (bad input, a result too large for the broker), echoing at
most ``PAYLOAD_ECHO_LIMIT`` bytes of its payload.

Field names follow Synkro's ``asHandler`` where they overlap (``debateOutput``, ``debateSynthesis``,
``debateRounds``, ``debateStatus``, ``debateTokenUsage``) so Synkro consumers can read our results.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec
from pydantic import BaseModel

from debatebus._redaction import redact
from debatebus._usage import ZERO_USAGE, TokenUsage
from debatebus.engine._debate import DebateMetrics
from debatebus.engine._result import DebateResult
from debatebus.schemas.result import HandlerResult

#: Failure results echo the request's payload up to this many bytes of JSON; above it they keep
#: only its small fields and say what was dropped (``debatePayloadTruncated``).
PAYLOAD_ECHO_LIMIT: Final = 64 * 1024
#: In a truncated echo: fields kept when their JSON is this small, up to _KEPT_BYTES in all.
_SMALL_FIELD: Final = 1024
_KEPT_BYTES: Final = 16 * 1024
_LISTED_DROPS: Final = 20
_JSON: Final = msgspec.json.Encoder()

#: Set (true) on the result of a debate that ran again because its stored result had expired
#: (absent otherwise): the request's debate id had been answered before, longer ago than the
#: store's retention.
RESULT_EXPIRED = "debateResultExpired"

#: Every field debatebus writes into a result. A result echoes its request's payload without
#: them (``echo``), so a producer cannot forge one (a planted ``debateTotalTokenUsage``), and a
#: hop of a chain, whose payload is the previous hop's result, does not pass that hop's fields
#: off as its own.
RESULT_FIELDS: frozenset[str] = frozenset({
    "debateId", "debateOutput", "debateSynthesis", "debateRounds", "debateStatus",
    "debateTokenUsage", "debateCalls", "debateTranscript", "debateVerdict", "debatePhiHat", "debateAgents",
    "debateDurationMs", "debateSatisfied", "debateError", "debateReplayed", "debateRetryable",
    "debateResumedFromRound", "debateSubDebates", "debateChildrenTokenUsage",
    "debateTotalTokenUsage", RESULT_EXPIRED, "debatePayloadTruncated", "debateCost",
    "debateStopReason", "debateForkOf",
})


def echo(payload: Mapping[str, Any]) -> dict[str, Any]:
    """What a result echoes of its request's ``payload``: all but the fields debatebus writes."""
    return {name: value for name, value in payload.items() if name not in RESULT_FIELDS}


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def to_builtins(value: Any) -> Any:
    """Plain JSON-ready data (dicts, lists, str…) from structs and pydantic verdicts."""
    return msgspec.to_builtins(value, enc_hook=_enc_hook)


def _usage(usage: TokenUsage) -> dict[str, int]:
    return {"promptTokens": usage.prompt_tokens, "completionTokens": usage.completion_tokens,
            "totalTokens": usage.total_tokens, "cacheReadTokens": usage.cache_read_tokens,
            "cacheWriteTokens": usage.cache_write_tokens}


def _sub_debate_fields(result: DebateResult) -> dict[str, Any]:
    """A debate that started sub-debates lists them; ``debateTokenUsage`` stays its own, and
    ``debateTotalTokenUsage`` adds its children's (absent when it started none)."""
    if not result.sub_debates:
        return {}
    return {
        "debateSubDebates": [
            {"domain": r.domain, "debateId": r.child_id, "requestedBy": r.requested_by,
             "status": r.status, "synthesis": r.synthesis, "tokenUsage": _usage(r.usage),
             "error": redact(r.error) if r.error else r.error}
            for r in result.sub_debates
        ],
        "debateChildrenTokenUsage": _usage(result.children_usage),
        "debateTotalTokenUsage": _usage(result.total_usage),
    }


def _run_fields(result: DebateResult) -> dict[str, Any]:
    """How the run went beyond its status: resumed from a committed round (a re-run); for a
    failure, whether it may pass (``debateRetryable``: a resend or replay runs it again) and the
    budget or spend limit that stopped it (``debateStopReason``); what it cost (``debateCost``),
    when its prices priced every model it used: absent otherwise, never an estimate."""
    fields: dict[str, Any] = {}
    if result.resumed_from_round:
        fields["debateResumedFromRound"] = result.resumed_from_round
    if result.status == "failed":
        fields["debateRetryable"] = result.retryable
    if result.stop_reason is not None:
        fields["debateStopReason"] = result.stop_reason
    if result.cost is not None:
        fields["debateCost"] = to_builtins(result.cost)
    return fields


def result_fields(result: DebateResult) -> dict[str, Any]:
    """The result fields of a debate that ran (``debateReplayed`` is false: a stored or shared
    result is marked where it is replayed); its error is redacted like ``failure_fields``'."""
    metrics = DebateMetrics.of(result)
    return {
        "debateId": result.debate_id,
        "debateOutput": result.output,
        "debateSynthesis": result.synthesis,
        "debateRounds": len(result.rounds),
        "debateStatus": result.status,
        "debateTokenUsage": _usage(result.token_usage),
        "debateCalls": result.calls,
        "debateTranscript": to_builtins(result.rounds),
        "debateVerdict": to_builtins(result.verdict),
        "debatePhiHat": metrics.phi_hat,
        "debateAgents": list(metrics.agents),
        "debateDurationMs": metrics.duration_ms,
        "debateSatisfied": result.satisfied,
        "debateError": redact(result.error) if result.error else result.error,
        "debateReplayed": False,
        **_run_fields(result),
        **_sub_debate_fields(result),
    }


def fork_fields(parent_id: str, from_round: int) -> dict[str, Any]:
    """What a fork's result says of its origin: ``debateForkOf``, the parent debate's id and the
    committed rounds taken from it (docs/forks.md)."""
    return {"debateForkOf": {"debateId": parent_id, "fromRound": from_round}}


def failure_fields(debate_id: str, error: str) -> dict[str, Any]:
    """The result fields of a request that failed before any debate ran (bad input, drift…): a
    final failure, which the same request would meet again (``debateRetryable`` false).

    ``error`` is redacted here as a safety net: providers already mask the secrets in their errors,
    but this text is published, stored and shown to whoever reads the results."""
    return {
        "debateId": debate_id,
        "debateOutput": "",
        "debateSynthesis": None,
        "debateRounds": 0,
        "debateStatus": "failed",
        "debateTokenUsage": _usage(ZERO_USAGE),
        "debateError": redact(error),
        "debateReplayed": False,
        "debateRetryable": False,
    }


def answer(payload: Mapping[str, Any], fields: Mapping[str, Any], *,
           shared: bool = False) -> HandlerResult:
    """The result answering a request (``payload``) with a debate's ``fields``: the payload
    echoed, then the fields. ``shared``: the fields are another call's, for a copy of the same
    request (marked ``debateReplayed``, as a stored result marks itself)."""
    merged = {**echo(payload), **fields, "debateReplayed": True} if shared else {
        **echo(payload), **fields}
    replayed = shared or fields.get("debateReplayed") is True
    failed = fields.get("debateStatus") == "failed"
    return HandlerResult("failed" if failed else "completed", merged, replayed)


def failure_result(payload: Mapping[str, Any], request_id: str, error: str, *,
                   echo_limit: int = PAYLOAD_ECHO_LIMIT) -> HandlerResult:
    """A request that failed before or instead of a debate: its payload echoed (up to
    ``echo_limit`` bytes of JSON) with the failure fields."""
    echoed = _echo(payload, echo_limit)
    debate_id = echoed.get("debateId")  # not when it was too big to echo
    return HandlerResult("failed", {
        **echoed, **failure_fields(debate_id if isinstance(debate_id, str) else request_id, error)})


def _echo(payload: Mapping[str, Any], limit: int) -> dict[str, Any]:
    """``payload`` (its ``echo``) when its JSON fits in ``limit`` bytes; else its small fields and
    ``debatePayloadTruncated``: the payload's size, the limit, and the fields dropped."""
    size = len(_JSON.encode(payload))
    if size <= limit:
        return echo(payload)
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    budget = min(_KEPT_BYTES, limit // 4)
    for name, value in echo(payload).items():
        cost = len(name) + len(_JSON.encode(value))
        if cost <= _SMALL_FIELD and cost <= budget:
            kept[name] = value
            budget -= cost
        else:
            dropped.append(name)
    listed = [name[:64] for name in dropped[:_LISTED_DROPS]]
    return {**kept, "debatePayloadTruncated": {
        "bytes": size, "limit": limit, "dropped": listed, "droppedCount": len(dropped)}}
