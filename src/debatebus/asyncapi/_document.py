"""The AsyncAPI 3.0 document of a debatebus worker, so other teams can discover and generate clients.

Built from a ``DebateBus`` app (its routes, events channel and group: ``debatebus asyncapi
module:app``), or for a worker serving one debate event type with the default settings. Its
servers are the broker's hosts when a broker URL is given (never its credentials or query),
else an example server on localhost for each transport.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import msgspec

from debatebus import __version__
from debatebus._redaction import redact
from debatebus._worker import DEFAULT_GROUP, EVENTS_TOPIC, DebateBus
from debatebus.asyncapi._payloads import schema_components
from debatebus.exceptions import ConfigError
from debatebus.handlers._handler import DebateHandler
from debatebus.schemas.envelope import completed_topic, failed_topic
from debatebus.schemas.events import EVENT_TYPES
from debatebus.transports._base import dlq_topic
from debatebus.transports.kafka._names import kafka_topic

ASYNCAPI_VERSION: Final = "3.0.0"
KAFKA_BINDING: Final = "0.5.0"
_JSON: Final = "application/json"


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


#: Per broker URL scheme: the server's key, protocol and title, and what the transport is.
_SERVER_KINDS: Final = {
    "redis": ("redisStreams", "redis", "Redis Streams",
              "Consumer groups, redelivery, dead letters."),
    "rediss": ("redisStreams", "redis", "Redis Streams over TLS",
               "Consumer groups, redelivery, dead letters."),
    "redis+pubsub": ("redisPubsub", "redis", "Redis pub/sub",
                     "Synkro's PUBLISH/SUBSCRIBE wire and semantics: at-most-once."),
    "rediss+pubsub": ("redisPubsub", "redis", "Redis pub/sub over TLS",
                      "Synkro's PUBLISH/SUBSCRIBE wire and semantics: at-most-once."),
    "kafka": ("kafka", "kafka", "Kafka",
              "One topic per event type (':' becomes '.'), key = requestId."),
}


def _broker_servers(url: str) -> dict[str, Any]:
    """A server per host of the broker at ``url``: its hosts and database, never the URL's user,
    password or query. ``memory://`` has none: it lives inside one process."""
    scheme = url.partition("://")[0].lower()
    if scheme == "memory":
        return {}
    if scheme not in _SERVER_KINDS:
        raise ConfigError(f"cannot document the servers of {redact(url)!r}: give a "
                          f"{', '.join(f'{s}://' for s in _SERVER_KINDS)} or memory:// URL")
    key, protocol, title, description = _SERVER_KINDS[scheme]
    try:
        parts = urlsplit(url)
        hosts = [host.strip() for host in parts.netloc.rpartition("@")[2].split(",")]
        for host in hosts:
            _ = urlsplit(f"//{host}").port  # reading it validates it
    except ValueError as exc:
        raise ConfigError(f"bad broker URL {redact(url)!r}: {exc}") from None
    path = parts.path.rstrip("/") if protocol == "redis" else ""
    shown = f"{scheme}://{','.join(hosts)}{path}"
    servers: dict[str, Any] = {}
    for number, host in enumerate(hosts, 1):
        server: dict[str, Any] = {
            "host": host or "localhost", "protocol": protocol,
            "title": f"{title} (broker URL {shown})", "description": description,
        }
        if path:
            server["pathname"] = path
        if protocol == "kafka":
            server["bindings"] = {"kafka": {"bindingVersion": KAFKA_BINDING}}
        servers[key if len(hosts) == 1 else f"{key}{number}"] = server
    return servers


def _example_servers() -> dict[str, Any]:
    return {
        "redisStreams": {
            "host": "localhost:6379", "pathname": "/0", "protocol": "redis",
            "title": "Redis Streams (broker URL redis://localhost:6379/0)",
            "description": "The default transport: consumer groups, redelivery, dead letters.",
        },
        "redisPubsub": {
            "host": "localhost:6379", "pathname": "/0", "protocol": "redis",
            "title": "Redis pub/sub (broker URL redis+pubsub://localhost:6379/0)",
            "description": "Synkro's PUBLISH/SUBSCRIBE wire and semantics: at-most-once; every "
                           "worker subscribed gets every request and Synkro's lock and dedupe keys "
                           "let one answer it. Failed requests are listed in Synkro's dead-letter "
                           "list; messages without a request id go to a dead-letter stream.",
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


def build_asyncapi(source: str | DebateBus = "debate:request", *,
                   broker: str | None = None) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of a ``DebateBus`` app: each event type it subscribes, with its
    completed, failed and dead-letter channels, and its events channel if it publishes events.
    Given an event type instead: a worker serving debates on it with the default group and
    events channel (channels are derived). ``broker``: the URL whose hosts the servers name (its
    credentials and query left out); None: an example server on localhost per transport."""
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
    servers = _example_servers() if broker is None else _broker_servers(broker)
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "id": "urn:debatebus",
        "info": _info(events_topic or EVENTS_TOPIC),
        "defaultContentType": _JSON,
        **({"servers": servers} if servers else {}),
        "channels": channels,
        "operations": operations,
        "components": {"schemas": schema_components(),
                       "messages": _messages(routes, events_topic is not None)},
    }
