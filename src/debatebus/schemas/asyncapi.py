"""The AsyncAPI 3.0 document of a debatebus worker, so other teams can discover and generate clients.

Built from a ``DebateBus`` app (its routes, events channel and group: ``debatebus asyncapi
module:app``), or for a worker serving one debate event type with the default settings.
Message schemas come from the msgspec structs the worker really encodes and decodes, so the
document cannot drift from the wire. The structs below add what the generic ones leave open: the
request payload (``Envelope.payload`` is any object) and the result payload (``result_fields``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from debatebus import __version__
from debatebus.engine.transcript import Round
from debatebus.exceptions import ConfigError
from debatebus.handlers.handler import DebateHandler
from debatebus.handlers.inputs import DEFAULT_MAX_INPUT_BYTES
from debatebus.schemas.envelope import Envelope, completed_topic, failed_topic
from debatebus.schemas.events import EVENT_TYPES, DebateEvent
from debatebus.schemas.usage import TokenUsage
from debatebus.transports.base import dlq_topic
from debatebus.transports.kafka.names import (
    DELIVERIES_HEADER,
    ORIGIN_HEADER,
    ORIGIN_OFFSET_HEADER,
    ORIGIN_PARTITION_HEADER,
    REASON_HEADER,
    kafka_topic,
)
from debatebus.worker import DEFAULT_GROUP, EVENTS_TOPIC, DebateBus

__all__ = [
    "ASYNCAPI_VERSION",
    "DeadLetterHeaders",
    "RedisDeadLetterEntry",
    "RequestPayload",
    "ResultPayload",
    "build_asyncapi",
    "schema_components",
]

ASYNCAPI_VERSION: Final = "3.0.0"
KAFKA_BINDING: Final = "0.5.0"
_SCHEMA_REF: Final = "#/components/schemas/{name}"
_JSON: Final = "application/json"


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


class ResultPayload(msgspec.Struct, rename="camel", omit_defaults=True):
    """The request payload's own fields, echoed, plus the debate's outcome (``debate*`` fields,
    named as in Synkro's ``asHandler``). A request that failed before its debate ran may carry
    only debateId, debateStatus, debateError, debateRounds, debateOutput and debateTokenUsage."""

    debate_id: str
    debate_status: Literal["completed", "failed"]
    debate_rounds: Annotated[int, Meta(ge=0, description="Rounds completed.")]
    debate_output: Annotated[str, Meta(description="The synthesis, or the last round's text.")]
    debate_token_usage: TokenUsage
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
    debate_satisfied: Annotated[bool, Meta(description="The stop rule was met.")] = False
    debate_replayed: Annotated[bool, Meta(
        description="The stored result of an earlier run was replayed, nothing was re-run.",
    )] = False
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
    "A debate result. ``correlationId`` and ``causationId`` name the request; its ``headers`` "
    "(W3C ``traceparent`` among them) are carried over."
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
    properties = {**envelope["properties"], "payload": {"$ref": _SCHEMA_REF.format(name=payload)}}
    return {**envelope, "title": f"{payload.removesuffix('Payload')}Envelope",
            "description": description, "properties": properties}


def schema_components() -> dict[str, Any]:
    """JSON Schemas of every message, keyed by name, ``$ref``-ing ``#/components/schemas/…``."""
    roots = [Envelope, RequestPayload, ResultPayload, DeadLetterHeaders, RedisDeadLetterEntry,
             *EVENT_TYPES]
    _, schemas = msgspec.json.schema_components(roots, ref_template=_SCHEMA_REF)
    (union,), _ = msgspec.json.schema_components([DebateEvent], ref_template=_SCHEMA_REF)
    envelope = schemas["Envelope"]
    schemas.update(
        RequestEnvelope=_narrowed(envelope, "RequestPayload", _REQUEST_ENVELOPE),
        ResultEnvelope=_narrowed(envelope, "ResultPayload", _RESULT_ENVELOPE),
        DebateEvent=_event_union(union),
    )
    return dict(_asyncapi_discriminators(schemas))


# ---- document ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Route:
    """One event type the worker serves, as the document names its channels and operations."""

    event_type: str
    debate: bool  # a DebateHandler (debate payloads), or any other handler (any object)
    suffix: str  # "" when it is the only route; otherwise what tells its ids apart


def _ref(path: str) -> dict[str, str]:
    return {"$ref": path}


def _kafka_channel(address: str) -> dict[str, Any]:
    """The channel's Kafka binding; none for an event type Kafka cannot carry (Redis can)."""
    try:
        topic = kafka_topic(address)
    except ConfigError:
        return {}
    return {"kafka": {"topic": topic, "bindingVersion": KAFKA_BINDING}}


def _kafka_key(description: str) -> dict[str, Any]:
    return {"kafka": {"key": {"type": "string", "description": description},
                      "bindingVersion": KAFKA_BINDING}}


_REQUEST_KEY: Final = _kafka_key("The requestId, so a request and its results share a partition.")
_CORRELATION: Final = {"description": "The request's id.", "location": "$message.payload#/requestId"}

_REQUEST_EXAMPLE: Final = {
    "requestId": "req-42",
    "payload": {"input": "Should we adopt microservices?", "maxRounds": 2},
}


def _result_example(status: str) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "input": "Should we adopt microservices?", "maxRounds": 2, "debateId": "req-42",
        "debateStatus": "completed", "debateRounds": 2, "debateOutput": "Adopt them gradually.",
        "debateTokenUsage": {"promptTokens": 900, "completionTokens": 300, "totalTokens": 1200},
        "debateVerdict": {"consensus": True, "summary": "Both agree on a gradual move."},
        "debatePhiHat": 0.82, "debateSatisfied": True, "debateReplayed": False,
    }
    if status == "failed":
        payload.update(debateStatus="failed", debateSatisfied=False,
                       debateError="budget max_calls=6 reached")
    return {
        "requestId": "req-42", "type": f"event:debate:request:{status}",
        "correlationId": "req-42", "causationId": "req-42",
        "timestamp": "2026-01-01T00:00:00.000Z", "payload": payload,
    }


def _info(events_topic: str) -> dict[str, Any]:
    return {
        "title": "debatebus",
        "version": __version__,
        "description": (
            "Multi-agent LLM debates served as event handlers. A producer publishes a debate "
            "request; a worker runs the debate and publishes the result on "
            "`event:{type}:completed` or `event:{type}:failed` with the request's requestId, and "
            f"(when started with publish_events) each step of the debate on `{events_topic}`. "
            "Messages that cannot even be read go to the dead-letter channel `{type}:dlq`.\n\n"
            "Wire formats: on Redis Streams a message is a stream entry whose field `envelope` "
            "holds the JSON body (plus `key` and `headers`, a JSON object, when present); on "
            "Redis pub/sub it is the body PUBLISHed on the channel (dead letters still go to a "
            "stream); on Kafka the topic is the event type with `:` replaced by `.`, the record "
            "key is the requestId and the headers include `content-type: application/json` and "
            "`x-debatebus-schema-version`."
        ),
        "license": {"name": "MIT"},
    }


def _servers() -> dict[str, Any]:
    return {
        "redisStreams": {
            "host": "localhost:6379", "pathname": "/0", "protocol": "redis",
            "title": "Redis Streams (broker URL redis://localhost:6379/0)",
            "description": "The default transport: consumer groups, redelivery, dead letters.",
        },
        "redisPubsub": {
            "host": "localhost:6379", "pathname": "/0", "protocol": "redis",
            "title": "Redis pub/sub (broker URL redis+pubsub://localhost:6379/0)",
            "description": "Synkro-compatible PUBLISH/SUBSCRIBE: at-most-once, and every worker "
                           "subscribed gets every request. Dead letters go to a stream.",
        },
        "kafka": {
            "host": "localhost:9092", "protocol": "kafka",
            "title": "Kafka (broker URL kafka://localhost:9092)",
            "description": "One topic per event type (':' becomes '.'), key = requestId.",
            "bindings": {"kafka": {"bindingVersion": KAFKA_BINDING}},
        },
    }


def _channel(address: str, title: str, description: str, messages: dict[str, str]) -> dict[str, Any]:
    channel = {
        "address": address,
        "title": title,
        "description": description,
        "messages": {key: _ref(f"#/components/messages/{name}") for key, name in messages.items()},
    }
    bindings = _kafka_channel(address)
    return {**channel, "bindings": bindings} if bindings else channel


def _event_message_keys() -> dict[str, str]:
    """Channel message key (the event's ``type`` tag) → component message name (its class)."""
    return {str(cls.__struct_config__.tag): cls.__name__ for cls in EVENT_TYPES}


def _route_channels(route: _Route) -> dict[str, Any]:
    event_type, s = route.event_type, route.suffix
    served = "debates" if route.debate else "requests"
    requests = "Debate requests" if route.debate else "Requests"
    return {
        f"debateRequest{s}": _channel(
            event_type, f"{requests}{s and f' ({event_type})'}",
            "Producers publish here; workers consume it as a group.",
            {"debateRequest": "DebateRequest" if route.debate else "Request"}),
        f"debateCompleted{s}": _channel(
            completed_topic(event_type), f"Completed {served}",
            "The result of each request whose debate completed (or was replayed)." if route.debate
            else "The handler's result for each request it answered.",
            {"debateCompleted": "DebateRequestCompleted" if route.debate else "Result"}),
        f"debateFailed{s}": _channel(
            failed_topic(event_type), f"Failed {served}",
            "The result of each request that failed: bad input, or a debate that could not finish.",
            {"debateFailed": "DebateRequestFailed"}),
        f"debateRequestDlq{s}": _channel(
            dlq_topic(event_type), "Dead letters",
            "Requests that could not be read (not JSON, no requestId) or were delivered too many "
            "times, with their original bytes untouched.", {"deadLetter": "DeadLetter"}),
    }


def _events_channel(events_topic: str) -> dict[str, Any]:
    return {"debateEvents": _channel(
        events_topic, "Debate events",
        "Every step of every debate as it happens, in order per debate (seq), when the worker "
        "runs with publish_events.", _event_message_keys())}


def _operation(action: str, channel: str, keys: list[str], summary: str) -> dict[str, Any]:
    return {
        "action": action,
        "channel": _ref(f"#/channels/{channel}"),
        "summary": summary,
        "messages": [_ref(f"#/channels/{channel}/messages/{key}") for key in keys],
    }


def _route_operations(route: _Route, group: str) -> dict[str, Any]:
    s = route.suffix
    receive = _operation("receive", f"debateRequest{s}", ["debateRequest"],
                         "A worker runs a debate for each request." if route.debate
                         else "A worker runs its handler for each request.")
    receive["bindings"] = {"kafka": {
        "groupId": {"type": "string", "enum": [group], "description": "The default group."
                    if group == DEFAULT_GROUP else "The worker's group."},
        "bindingVersion": KAFKA_BINDING,
    }}
    return {
        f"receiveDebateRequest{s}": receive,
        f"sendDebateCompleted{s}": _operation("send", f"debateCompleted{s}", ["debateCompleted"],
                                              "The worker publishes a completed request's result."
                                              if not route.debate else
                                              "The worker publishes a completed debate's result."),
        f"sendDebateFailed{s}": _operation("send", f"debateFailed{s}", ["debateFailed"],
                                           "The worker publishes a failed request's result."),
        f"sendDeadLetter{s}": _operation("send", f"debateRequestDlq{s}", ["deadLetter"],
                                         "The worker dead-letters a request it cannot read."),
    }


def _events_operation() -> dict[str, Any]:
    return {"sendDebateEvents": _operation(
        "send", "debateEvents", list(_event_message_keys()),
        "The worker publishes each debate's events as they happen.")}


def _result_message(status: str, summary: str) -> dict[str, Any]:
    return {
        "name": f"debate_request_{status}",
        "title": f"Debate request {status}",
        "summary": summary,
        "contentType": _JSON,
        "payload": _ref("#/components/schemas/ResultEnvelope"),
        "correlationId": _CORRELATION,
        "bindings": _REQUEST_KEY,
        "examples": [{"name": status, "payload": _result_example(status)}],
    }


def _event_message(cls: type[msgspec.Struct]) -> dict[str, Any]:
    tag = str(cls.__struct_config__.tag)
    return {
        "name": tag,
        "title": cls.__name__,
        "summary": f'A debate event with type "{tag}".',
        "contentType": _JSON,
        "payload": _ref(f"#/components/schemas/{cls.__name__}"),
        "bindings": _kafka_key("The requestId of the request that started the debate."),
    }


def _envelope_message(name: str, title: str, summary: str) -> dict[str, Any]:
    """A message of a handler that is not a debate: any payload object in the envelope."""
    return {"name": name, "title": title, "summary": summary, "contentType": _JSON,
            "payload": _ref("#/components/schemas/Envelope"), "correlationId": _CORRELATION,
            "bindings": _REQUEST_KEY}


def _messages(routes: list[_Route], events: bool) -> dict[str, Any]:
    messages: dict[str, Any] = {
        "DebateRequest": {
            "name": "debate_request",
            "title": "Debate request",
            "summary": "Asks a worker to run a debate on payload.input.",
            "contentType": _JSON,
            "payload": _ref("#/components/schemas/RequestEnvelope"),
            "correlationId": _CORRELATION,
            "bindings": _REQUEST_KEY,
            "examples": [{"name": "minimal", "payload": _REQUEST_EXAMPLE}],
        },
        "DebateRequestCompleted": _result_message("completed", "A debate's result."),
        "DebateRequestFailed": _result_message("failed", "Why a request failed, and what was done."),
        "DeadLetter": {
            "name": "dead_letter",
            "title": "Dead letter",
            "summary": "The original message, untouched, with the reason in its headers.",
            "description": "The payload is whatever was published (usually a request envelope, "
                           "possibly not JSON at all). On Redis Streams the entry's fields are "
                           "described by x-debatebus-redis-entry.",
            "headers": _ref("#/components/schemas/DeadLetterHeaders"),
            "payload": {"description": "The original message bytes."},
            "bindings": _REQUEST_KEY,
            "x-debatebus-redis-entry": _ref("#/components/schemas/RedisDeadLetterEntry"),
        },
    }
    if not all(route.debate for route in routes):
        messages.update(
            Request=_envelope_message("request", "Request", "A request to a handler that is "
                                      "not a debate: its payload is any JSON object."),
            Result=_envelope_message("result", "Result", "That handler's result: its payload "
                                     "is the object the handler returned."))
    if events:
        messages.update({cls.__name__: _event_message(cls) for cls in EVENT_TYPES})
    return messages


def _routes(app: DebateBus) -> list[_Route]:
    """The app's routes in subscription order, each with ids of its own (a suffix from its event
    type) unless it is the only one."""
    handlers = app.handlers()
    if not handlers:
        raise ConfigError("the app subscribes no handler: there is nothing to document")
    if len(handlers) == 1:
        ((event_type, handler),) = handlers.items()
        return [_Route(event_type, isinstance(handler, DebateHandler), "")]
    routes: dict[str, _Route] = {}
    for event_type, handler in handlers.items():
        suffix = "_" + re.sub(r"[^A-Za-z0-9.-]", "_", event_type.replace(":", "."))
        if suffix in routes:
            raise ConfigError(f"event types {routes[suffix].event_type!r} and {event_type!r} "
                              "would share AsyncAPI channel ids: rename one of them")
        routes[suffix] = _Route(event_type, isinstance(handler, DebateHandler), suffix)
    return list(routes.values())


def build_asyncapi(source: str | DebateBus = "debate:request") -> dict[str, Any]:
    """The AsyncAPI 3.0 document of a ``DebateBus`` app: each event type it subscribes, with its
    completed, failed and dead-letter channels, and its events channel if it publishes events.
    Given an event type instead: a worker serving debates on it with the default group and
    events channel (channels are derived)."""
    if isinstance(source, DebateBus):
        routes = _routes(source)
        events_topic = source.events_topic if source.publish_events else None
        group = source.group
    else:
        routes, events_topic, group = [_Route(source, True, "")], EVENTS_TOPIC, DEFAULT_GROUP
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for route in routes:
        channels.update(_route_channels(route))
        operations.update(_route_operations(route, group))
    if events_topic is not None:
        channels.update(_events_channel(events_topic))
        operations.update(_events_operation())
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "id": "urn:debatebus",
        "info": _info(events_topic or EVENTS_TOPIC),
        "defaultContentType": _JSON,
        "servers": _servers(),
        "channels": channels,
        "operations": operations,
        "components": {"schemas": schema_components(),
                       "messages": _messages(routes, events_topic is not None)},
    }
