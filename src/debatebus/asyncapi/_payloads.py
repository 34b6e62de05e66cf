"""The message schemas of the AsyncAPI document, from the msgspec structs the worker really encodes
and decodes, so the document cannot drift from the wire. The structs here add what the generic ones
leave open: the request payload (``Envelope.payload`` is any object), the result payload
(``result_fields``) and dead letters. Documentation only: the worker reads payloads as plain dicts.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from debatebus._usage import TokenUsage
from debatebus.engine._result import StopReason
from debatebus.engine._transcript import Round
from debatebus.handlers._inputs import DEFAULT_MAX_INPUT_BYTES, MAX_DEPTH_LIMIT
from debatebus.schemas.cost import DebateCost
from debatebus.schemas.envelope import Envelope
from debatebus.schemas.events import EVENT_TYPES, BusEvent
from debatebus.transports._base import (
    DELIVERIES_HEADER,
    ORIGIN_HEADER,
    ORIGIN_OFFSET_HEADER,
    ORIGIN_PARTITION_HEADER,
    REASON_HEADER,
)

#: How a message schema refers to another one.
SCHEMA_REF: Final = "#/components/schemas/{name}"


# ---- payload structs (documentation only: the worker reads payloads as plain dicts) -------------


class RequestPayload(msgspec.Struct, rename="camel", omit_defaults=True):
    """What a producer asks for. Unknown fields are allowed and echoed back in the result."""

    input: Annotated[str, Meta(
        pattern=r"\S",
        description=f"The debate topic: a non-blank string of at most {DEFAULT_MAX_INPUT_BYTES} "
                    "bytes of UTF-8 (the handler's max_input_bytes).",
        examples=["Should we adopt microservices?"],
    )]
    max_rounds: Annotated[Annotated[int, Meta(ge=1, le=1000)] | None, Meta(
        description="Cap on the rounds, never above the debate's own max_rounds.",
    )] = None
    debate_id: Annotated[Annotated[str, Meta(min_length=1, max_length=256)] | None, Meta(
        description="Names the debate (default: the requestId). Re-sending the id of a finished "
                    "debate replays its stored result; a checkpointed one resumes.",
    )] = None
    replay: Annotated[Literal["rerun"] | None, Meta(
        description='"rerun" runs afresh under a new debate id instead of replaying.',
    )] = None
    preset: Annotated[str | None, Meta(
        description="A ready panel from debatebus.engine._presets (e.g. starter_trio) instead of the "
                    "handler's own debate; only those the handler serves (as_handler(presets=…)).",
    )] = None
    parent_debate_id: Annotated[str | None, Meta(
        description="Set on a sub-debate's request by its parent's worker: the parent's debate "
                    "id (echoed in the result).",
    )] = None
    depth: Annotated[Annotated[int, Meta(ge=0, le=MAX_DEPTH_LIMIT)] | None, Meta(
        description="Set on a sub-debate's request by its parent's worker: its nesting depth "
                    "(parent's + 1), so the debate's max_depth holds across the bus.",
    )] = None


class SubDebateSummary(msgspec.Struct, rename="camel"):
    """One child debate: its domain, debate (and request) id, who asked, how it ended."""

    domain: str
    debate_id: str
    requested_by: str
    status: Literal["running", "completed", "failed"]
    synthesis: str | None
    token_usage: TokenUsage
    error: str | None


class ResultPayload(msgspec.Struct, rename="camel", omit_defaults=True):
    """The request payload's own fields, echoed, plus the debate's outcome (``debate*`` fields,
    named as in Synkro's ``asHandler``). A request that failed before its debate ran may carry
    only debateId, debateStatus, debateError, debateRounds, debateOutput and debateTokenUsage."""

    debate_id: str
    debate_status: Literal["completed", "failed"]
    debate_rounds: Annotated[int, Meta(ge=0, description="Rounds completed.")]
    debate_output: Annotated[str, Meta(description="The synthesis, or the last round's text.")]
    debate_token_usage: TokenUsage
    debate_calls: Annotated[Annotated[int, Meta(ge=0)] | UnsetType, Meta(
        description="The model calls the debate made (its own; failed ones too).",
    )] = UNSET
    debate_error: Annotated[str | None, Meta(description="Why the debate failed.")] = None
    debate_synthesis: str | None = None
    debate_transcript: Annotated[list[Round] | UnsetType, Meta(
        description="Every round: turns in speaking order, verdict, token usage.",
    )] = UNSET
    debate_verdict: Annotated[dict[str, Any] | None, Meta(
        description="The judge's last verdict (the judge schema's fields; by default "
                    "consensus, summary, winner).",
    )] = None
    debate_phi_hat: Annotated[float | None, Meta(
        description="Φ̂, the integration score: how much the participants' wording moved between "
                    "their texts (mean Jaccard distance, 0..1).",
    )] = None
    debate_agents: Annotated[list[str] | UnsetType, Meta(
        description="The participants with at least one turn that did not fail, in the order "
                    "they first spoke.",
    )] = UNSET
    debate_duration_ms: Annotated[Annotated[float, Meta(ge=0)] | UnsetType, Meta(
        description="How long the debate ran, in milliseconds.",
    )] = UNSET
    debate_satisfied: Annotated[bool, Meta(description="The stop rule was met.")] = False
    debate_replayed: Annotated[bool, Meta(
        description="The stored result of an earlier run was replayed, nothing was re-run.",
    )] = False
    debate_sub_debates: Annotated[list[SubDebateSummary] | UnsetType, Meta(
        description="The sub-debates this debate started (absent when none), in start order.",
    )] = UNSET
    debate_children_token_usage: Annotated[TokenUsage | UnsetType, Meta(
        description="What its sub-debates spent, theirs included (absent when none).",
    )] = UNSET
    debate_total_token_usage: Annotated[TokenUsage | UnsetType, Meta(
        description="debateTokenUsage (its own calls) plus debateChildrenTokenUsage.",
    )] = UNSET
    debate_cost: Annotated[DebateCost | UnsetType, Meta(
        description="What the debate cost, its sub-debates included, by speaker: only when the "
                    "debate's prices priced every model it used (absent otherwise: never an "
                    "estimate).",
    )] = UNSET
    debate_stop_reason: Annotated[StopReason | UnsetType, Meta(
        description="On a failed result stopped by a Budget limit (max_calls, max_total_tokens, "
                    "max_cost: final) or a fleet spend limit (spend_limit: retryable).",
    )] = UNSET
    input: Annotated[Any, Meta(description="Echoed from the request.")] = UNSET
    max_rounds: Annotated[Any, Meta(description="Echoed from the request.")] = UNSET
    replay: Annotated[Any, Meta(description="Echoed from the request.")] = UNSET


class DeadLetterHeaders(msgspec.Struct, omit_defaults=True, rename={
    "reason": REASON_HEADER,
    "origin": ORIGIN_HEADER,
    "origin_id": "x-debatebus-origin-id",
    "origin_partition": ORIGIN_PARTITION_HEADER,
    "origin_offset": ORIGIN_OFFSET_HEADER,
    "deliveries": DELIVERIES_HEADER,
}):
    """Headers a dead letter carries besides the original message's own (all strings)."""

    reason: Annotated[str, Meta(description="Why it was dead-lettered and what to fix.")]
    origin: Annotated[str, Meta(description="The event type it was published on.")]
    origin_id: Annotated[str | UnsetType, Meta(
        description="Redis: the original stream entry id.")] = UNSET
    origin_partition: Annotated[str | UnsetType, Meta(
        description="Kafka: the original partition.")] = UNSET
    origin_offset: Annotated[str | UnsetType, Meta(
        description="Kafka: the original offset.")] = UNSET
    deliveries: Annotated[str | UnsetType, Meta(
        description="How many times it was delivered (a decimal number).")] = UNSET


class RedisDeadLetterEntry(msgspec.Struct, rename="camel", omit_defaults=True):
    """The fields of a dead-letter entry in the Redis stream ``{type}:dlq``."""

    envelope: Annotated[str, Meta(description="The original message bytes, untouched.")]
    reason: str
    origin: Annotated[str, Meta(description="The stream it came from.")]
    origin_id: Annotated[str, Meta(description="Its entry id there.")]
    deliveries: Annotated[str, Meta(pattern=r"^[0-9]+$")]
    key: str | UnsetType = UNSET
    headers: Annotated[str | UnsetType, Meta(
        description="The original headers as a JSON object of strings.")] = UNSET


_REQUEST_ENVELOPE: Final = 'A debate request: ``{"requestId": "...", "payload": {"input": "<topic>"}}``.'
_RESULT_ENVELOPE: Final = (
    "A debate result, with a ``messageId`` of its own. ``causationId`` is the request's "
    "``messageId`` (its ``requestId`` when the request has none) and ``correlationId`` is carried "
    "over from the request; so are its ``headers`` (W3C ``traceparent`` among them)."
)


# ---- schemas -----------------------------------------------------------------------------------


def _asyncapi_discriminators(node: Any) -> Any:
    """msgspec writes OpenAPI's ``discriminator`` object; AsyncAPI 3.0 wants the property name
    alone, so keep the mapping under an extension key rather than lose it."""
    if isinstance(node, list):
        return [_asyncapi_discriminators(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _asyncapi_discriminators(value) for key, value in node.items()}
    found = out.get("discriminator")
    if isinstance(found, dict):
        out["discriminator"] = found["propertyName"]
        out["x-discriminator-mapping"] = found.get("mapping", {})
    return out


def _event_union(union: dict[str, Any]) -> dict[str, Any]:
    # AsyncAPI's discriminator must be a required property of the schema that declares it.
    tags = [cls.__struct_config__.tag for cls in EVENT_TYPES]
    return {
        "title": "DebateEvent",
        "description": "One event of a debate on debate:events, tagged by type.",
        "type": "object",
        "required": ["type"],
        "properties": {"type": {"enum": tags}},
        **union,
    }


def _narrowed(envelope: dict[str, Any], payload: str, description: str) -> dict[str, Any]:
    """The envelope schema with ``payload`` pointing at one payload schema. Patched rather than
    subclassed so that Envelope stays the one definition of the wire fields."""
    properties = {**envelope["properties"], "payload": {"$ref": SCHEMA_REF.format(name=payload)}}
    return {**envelope, "title": f"{payload.removesuffix('Payload')}Envelope",
            "description": description, "properties": properties}


def schema_components() -> dict[str, Any]:
    """JSON Schemas of every message, keyed by name, ``$ref``-ing ``#/components/schemas/…``."""
    roots = [Envelope, RequestPayload, ResultPayload, DeadLetterHeaders, RedisDeadLetterEntry,
             *EVENT_TYPES]
    _, schemas = msgspec.json.schema_components(roots, ref_template=SCHEMA_REF)
    (union,), _ = msgspec.json.schema_components([BusEvent], ref_template=SCHEMA_REF)
    envelope = schemas["Envelope"]
    schemas.update(
        RequestEnvelope=_narrowed(envelope, "RequestPayload", _REQUEST_ENVELOPE),
        ResultEnvelope=_narrowed(envelope, "ResultPayload", _RESULT_ENVELOPE),
        DebateEvent=_event_union(union),
    )
    return dict(_asyncapi_discriminators(schemas))


