"""The AsyncAPI document: valid AsyncAPI 3.0.0, internally consistent, and true to the wire.

The official AsyncAPI 3.0.0 JSON Schema is vendored beside this file (asyncapi-3.0.0.json, from
the ``@asyncapi/specs`` package 6.11.1, Apache-2.0: asyncapi-3.0.0.LICENSE) because no PyPI package
ships it. It is a Draft 7 schema whose definitions are embedded under their ``$id`` URLs, so with
the Draft 7 meta-schema from ``jsonschema-specifications`` every reference resolves offline; the
registry has no retriever, so a reference that did not would fail instead of fetching.
"""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema_specifications
import msgspec
import pytest
import yaml
from jsonschema import Draft7Validator
from jsonschema.exceptions import best_match
from referencing import Registry
from referencing.jsonschema import DRAFT7
from tests.support.bus import make_debate, running

from debatebus._worker import EVENTS_TOPIC, DebateBus
from debatebus.asyncapi import build_asyncapi
from debatebus.cli import main
from debatebus.exceptions import ConfigError, InputError
from debatebus.handlers._inputs import read_debate_id, read_max_rounds, read_question, read_replay
from debatebus.schemas.envelope import completed_topic, failed_topic
from debatebus.schemas.events import EVENT_TYPES
from debatebus.transports import Outgoing, dlq_topic
from debatebus.transports._memory import MemoryBroker, MemoryTransport
from debatebus.transports.kafka import kafka_topic

SPEC = Path(__file__).with_name("asyncapi-3.0.0.json")
DOC_URI = "https://debatebus.invalid/asyncapi.json"
TIMEOUT = 60.0


@cache
def asyncapi_validator() -> Draft7Validator:
    schema = json.loads(SPEC.read_text("utf-8"))
    spec = Registry().with_resource(schema["$id"], DRAFT7.create_resource(schema)).crawl()
    return Draft7Validator(schema, registry=jsonschema_specifications.REGISTRY.combine(spec))


def assert_valid_asyncapi(document: dict[str, Any]) -> None:
    error = best_match(asyncapi_validator().iter_errors(document))
    assert error is None, f"{error.json_path}: {error.message[:500]}"


def component_validator(document: dict[str, Any], pointer: str) -> Draft7Validator:
    """A validator for the schema at ``pointer`` in the document, its $refs resolved within it."""
    registry = Registry().with_resource(DOC_URI, DRAFT7.create_resource(document))
    return Draft7Validator({"$ref": f"{DOC_URI}#{pointer}"}, registry=registry)


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def resolve(document: dict[str, Any], ref: str) -> Any:
    node: Any = document
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


# ---- the document against the AsyncAPI 3.0.0 schema ---------------------------------------------


@pytest.mark.parametrize("event_type", ["debate:request", "orders:review"])
def test_document_is_valid_asyncapi_3(event_type: str) -> None:
    assert_valid_asyncapi(build_asyncapi(event_type))


MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "unknown operation action": lambda d: d["operations"]["sendDebateFailed"].update(action="publish"),
    "unknown kafka channel binding field": lambda d: d["channels"]["debateRequest"]["bindings"][
        "kafka"].update(partitionz=3),
    "OpenAPI-style discriminator": lambda d: d["components"]["schemas"]["DebateEvent"].update(
        discriminator={"propertyName": "type"}),
    "bad JSON Schema type in a payload": lambda d: d["components"]["schemas"]["TurnCompleted"][
        "properties"]["seq"].update(type="integr"),
    "correlation id without location": lambda d: d["components"]["messages"]["DebateRequest"].update(
        correlationId={"description": "no location"}),
}


@pytest.mark.parametrize("mutation", MUTATIONS, ids=list(MUTATIONS))
def test_the_validation_reaches_deep_into_the_document(mutation: str) -> None:
    """Guards against a vacuous check (an unresolved or skipped part of the spec schema)."""
    document = copy.deepcopy(build_asyncapi())
    MUTATIONS[mutation](document)
    assert best_match(asyncapi_validator().iter_errors(document)) is not None


def test_every_reference_in_the_document_resolves() -> None:
    document = build_asyncapi()
    found = list(refs(document))
    assert len(found) > 40
    for ref in found:
        assert ref.startswith("#/"), ref
        assert isinstance(resolve(document, ref), dict), ref


def test_channels_operations_and_bindings() -> None:
    document = build_asyncapi("orders:review")
    channels = document["channels"]
    assert {c["address"]: c["bindings"]["kafka"]["topic"] for c in channels.values()} == {
        "orders:review": "orders.review",
        "event:orders:review:completed": "event.orders.review.completed",
        "event:orders:review:failed": "event.orders.review.failed",
        "debate:events": "debate.events",
        "orders:review:dlq": "orders.review.dlq",
    }
    for channel in channels.values():  # the same names the Kafka transport uses
        assert channel["bindings"]["kafka"]["topic"] == kafka_topic(channel["address"])
    actions = {name: op["action"] for name, op in document["operations"].items()}
    assert actions == {"receiveDebateRequest": "receive", "sendDebateCompleted": "send",
                       "sendDebateFailed": "send", "sendDebateEvents": "send",
                       "sendDeadLetter": "send"}
    assert {"redisStreams", "redisPubsub", "kafka"} <= set(document["servers"])
    request = document["components"]["messages"]["DebateRequest"]
    assert request["bindings"]["kafka"]["key"]["type"] == "string"
    # one message per event type, named by its ``type`` tag
    assert "turn_completed" in channels["debateEvents"]["messages"]
    assert len(document["operations"]["sendDebateEvents"]["messages"]) == len(EVENT_TYPES) == 17
    messages = document["components"]["messages"].values()
    assert len({m["name"] for m in messages}) == 4 + 17  # no message shadows another


#: Every ``debate*`` field of a result (``schemas.results``).
DEBATE_FIELDS = (
    "debateId", "debateOutput", "debateSynthesis", "debateRounds", "debateStatus",
    "debateTokenUsage", "debateCalls", "debateTranscript", "debateVerdict", "debatePhiHat", "debateSatisfied",
    "debateError", "debateReplayed", "debateAgents", "debateDurationMs",
    # Only when the debate started sub-debates:
    "debateSubDebates", "debateChildrenTokenUsage", "debateTotalTokenUsage",
    # Only when known (every model priced) / when a budget or spend limit stopped it:
    "debateCost", "debateStopReason",
)


def test_result_payload_documents_every_debate_field() -> None:
    properties = build_asyncapi()["components"]["schemas"]["ResultPayload"]["properties"]
    assert {name for name in properties if name.startswith("debate")} == set(DEBATE_FIELDS)


def test_message_examples_match_their_payload_schemas() -> None:
    document = build_asyncapi()
    checked = 0
    for name, message in document["components"]["messages"].items():
        for example in message.get("examples", []):
            validator = component_validator(document, message["payload"]["$ref"].removeprefix("#"))
            error = best_match(validator.iter_errors(example["payload"]))
            assert error is None, f"{name} example {example['name']}: {error.message}"
            checked += 1
    assert checked == 3


def test_the_schemas_import_without_aiokafka() -> None:
    """The document names Kafka topics with the transport's own function, yet a Redis-only
    install (no kafka extra) must still build it."""
    code = ("import sys; import debatebus.asyncapi as a; a.build_asyncapi(); "
            "sys.exit('aiokafka' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_an_event_type_kafka_cannot_carry_has_no_kafka_binding() -> None:
    document = build_asyncapi("orders/review")  # fine on Redis; Kafka forbids '/'
    assert "bindings" not in document["channels"]["debateRequest"]
    assert_valid_asyncapi(document)


# ---- the document of an app ------------------------------------------------------------------------


async def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return dict(payload)


def two_routes() -> DebateBus:
    """An app with a debate and a plain handler, publishing no events (the CLI loads it)."""
    app = DebateBus(MemoryTransport(MemoryBroker()), group="reviewers")
    app.subscribe("orders:review", make_debate().as_handler())
    app.subscribe("orders:echo", echo)
    return app


def test_app_with_one_debate_route_gets_the_default_document() -> None:
    app = DebateBus(MemoryTransport(MemoryBroker()), publish_events=True)
    app.subscribe("orders:review", make_debate().as_handler())
    assert build_asyncapi(app) == build_asyncapi("orders:review")


def test_app_document_has_each_route_its_group_and_no_events_unless_published() -> None:
    document = build_asyncapi(two_routes())
    assert_valid_asyncapi(document)
    addresses = {name: c["address"] for name, c in document["channels"].items()}
    assert addresses == {
        "debateRequest_orders.review": "orders:review",
        "debateCompleted_orders.review": "event:orders:review:completed",
        "debateFailed_orders.review": "event:orders:review:failed",
        "debateRequestDlq_orders.review": "orders:review:dlq",
        "debateRequest_orders.echo": "orders:echo",
        "debateCompleted_orders.echo": "event:orders:echo:completed",
        "debateFailed_orders.echo": "event:orders:echo:failed",
        "debateRequestDlq_orders.echo": "orders:echo:dlq",
    }
    messages = document["components"]["messages"]
    assert "TurnCompleted" not in messages  # no events channel, so no event messages
    echo_request = document["channels"]["debateRequest_orders.echo"]["messages"]["debateRequest"]
    assert resolve(document, echo_request["$ref"])["payload"] == {
        "$ref": "#/components/schemas/Envelope"}  # a plain handler takes any payload object
    review = document["channels"]["debateRequest_orders.review"]["messages"]["debateRequest"]
    assert review["$ref"] == "#/components/messages/DebateRequest"
    receive = document["operations"]["receiveDebateRequest_orders.echo"]
    assert receive["bindings"]["kafka"]["groupId"]["enum"] == ["reviewers"]
    assert len(document["operations"]) == 8
    for ref in refs(document):
        assert isinstance(resolve(document, ref), dict), ref


def test_app_document_has_its_own_events_channel() -> None:
    app = DebateBus(MemoryTransport(MemoryBroker()), publish_events=True, events_topic="ops:steps")
    app.subscribe("orders:review", make_debate().as_handler())
    document = build_asyncapi(app)
    assert document["channels"]["debateEvents"]["address"] == "ops:steps"
    assert document["channels"]["debateEvents"]["bindings"]["kafka"]["topic"] == "ops.steps"
    assert_valid_asyncapi(document)


def test_app_without_routes_is_refused() -> None:
    with pytest.raises(ConfigError, match="no handler"):
        build_asyncapi(DebateBus(MemoryTransport(MemoryBroker())))


# ---- the request payload schema -------------------------------------------------------------------

GOOD_PAYLOADS = [
    {"input": "Should we adopt microservices?"},
    {"input": "t", "maxRounds": 2, "debateId": "d-1", "replay": "rerun"},
    {"input": "t", "maxRounds": None, "team": "core"},  # unknown fields are echoed, not refused
]
BAD_PAYLOADS = [
    {},
    {"input": ""},
    {"input": "   \n"},
    {"input": 42},
    {"input": "t", "maxRounds": 0},
    {"input": "t", "maxRounds": "2"},
    {"input": "t", "maxRounds": True},
    {"input": "t", "replay": "again"},
    {"input": "t", "debateId": ""},
    {"input": "t", "debateId": "x" * 257},
]


def handler_accepts(payload: dict[str, Any]) -> bool:
    try:
        read_question(payload)
        read_max_rounds(payload, cap=10)
        read_debate_id(payload)
        read_replay(payload)
    except InputError:
        return False
    return True


@pytest.mark.parametrize("payload", GOOD_PAYLOADS + BAD_PAYLOADS, ids=repr)
def test_request_schema_agrees_with_the_handler(payload: dict[str, Any]) -> None:
    validator = component_validator(build_asyncapi(), "/components/schemas/RequestEnvelope")
    valid = validator.is_valid({"requestId": "r-1", "payload": payload})
    assert valid == (payload in GOOD_PAYLOADS) == handler_accepts(payload)


@pytest.mark.parametrize("envelope", [
    {"payload": {"input": "t"}},
    {"requestId": "r-1", "payload": "not an object"},
    {"requestId": 7, "payload": {"input": "t"}},
    {"requestId": "r-1", "payload": {"input": "t"}, "headers": {"traceparent": 1}},
], ids=repr)
def test_request_schema_rejects_bad_envelopes(envelope: dict[str, Any]) -> None:
    validator = component_validator(build_asyncapi(), "/components/schemas/RequestEnvelope")
    assert not validator.is_valid(envelope)


# ---- real messages off a running worker -----------------------------------------------------------


async def collect_wire_messages() -> dict[str, list[Any]]:
    """Runs one good request, one bad one and one unreadable one through a worker, and returns
    every message on every documented channel, by channel."""
    event_type = f"debate:request{uuid.uuid4().hex[:8]}"
    broker = MemoryBroker()
    app = DebateBus(MemoryTransport(broker), publish_events=True)
    app.subscribe(event_type, make_debate().as_handler())
    topics = {"request": event_type, "completed": completed_topic(event_type),
              "failed": failed_topic(event_type), "events": EVENTS_TOPIC,
              "dlq": dlq_topic(event_type)}
    names = {topic: name for name, topic in topics.items()}
    seen: dict[str, list[Any]] = {name: [] for name in topics}
    async with running(app), MemoryTransport(broker) as wire:
        deliveries = await wire.subscribe(list(topics.values()))
        await app.publish(event_type, {"input": "Tabs or spaces?", "team": "core"}, request_id="ok")
        await app.publish(event_type, {"input": "   "}, request_id="bad")
        await wire.publish(Outgoing(event_type, b"\xff not json"))
        async with asyncio.timeout(TIMEOUT):
            async for delivery in deliveries:
                seen[names[delivery.topic]].append(delivery)
                if all(seen[n] for n in ("completed", "failed", "dlq")) and any(
                        b'"debate_completed"' in d.body for d in seen["events"]):
                    break
    return seen


async def test_what_the_worker_sends_matches_the_document() -> None:
    document = build_asyncapi()
    schemas = "/components/schemas/"
    seen = await collect_wire_messages()

    def check(delivery_body: bytes, schema: str) -> Any:
        data = msgspec.json.decode(delivery_body)
        error = best_match(component_validator(document, schemas + schema).iter_errors(data))
        assert error is None, f"{schema}: {error.json_path}: {error.message}"
        return data

    good, bad, _unreadable = seen["request"]
    assert check(good.body, "RequestEnvelope")["payload"]["team"] == "core"
    assert not component_validator(document, schemas + "RequestEnvelope").is_valid(
        json.loads(bad.body))  # the blank input the worker answered with a failure
    (completed,), (failed,) = seen["completed"], seen["failed"]
    assert check(completed.body, "ResultEnvelope")["payload"]["debateStatus"] == "completed"
    assert check(failed.body, "ResultEnvelope")["payload"]["debateStatus"] == "failed"
    types = {check(d.body, "DebateEvent")["type"] for d in seen["events"]}
    assert {"debate_started", "turn_completed", "verdict", "debate_completed"} <= types
    event_messages = document["channels"]["debateEvents"]["messages"]
    for delivery in seen["events"]:  # and each against the message its type names
        message = resolve(document, event_messages[json.loads(delivery.body)["type"]]["$ref"])
        check(delivery.body, message["payload"]["$ref"].removeprefix("#" + schemas))
    (dead,) = seen["dlq"]
    assert dead.body == b"\xff not json"
    headers_validator = component_validator(document, schemas + "DeadLetterHeaders")
    assert headers_validator.is_valid(dict(dead.headers)), dead.headers


# ---- the command ----------------------------------------------------------------------------------


def test_cli_prints_json_and_yaml(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEBATEBUS_BROKER", raising=False)
    expected = build_asyncapi()
    assert main(["asyncapi", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == expected
    assert main(["asyncapi"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == expected
    out = tmp_path / "asyncapi.yaml"
    assert main(["asyncapi", "--event-type", "orders:review", "-o", str(out)]) == 0
    written = yaml.safe_load(out.read_text("utf-8"))
    assert written["channels"]["debateRequest"]["address"] == "orders:review"
    assert_valid_asyncapi(written)


def test_cli_documents_an_app(capsys: pytest.CaptureFixture[str]) -> None:
    app = "tests.observability.test_asyncapi:two_routes"
    assert main(["asyncapi", app, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == build_asyncapi(two_routes())
    assert main(["asyncapi", app, "--event-type", "orders:review"]) != 0
    assert "not both" in capsys.readouterr().err


# ---- servers: the broker's, or examples -----------------------------------------------------------


@pytest.mark.parametrize(("url", "servers"), [
    ("redis://:hunter2secret@cache.internal:6380/2?ssl_cert_reqs=none", {"redisStreams": {
        "host": "cache.internal:6380", "protocol": "redis", "pathname": "/2",
        "title": "Redis Streams (broker URL redis://cache.internal:6380/2)"}}),
    ("rediss+pubsub://default:hunter2secret@h:6379/0", {"redisPubsub": {
        "host": "h:6379", "protocol": "redis", "pathname": "/0",
        "title": "Redis pub/sub over TLS (broker URL rediss+pubsub://h:6379/0)"}}),
    ("kafka://b1:9092,b2:9092?partitions=6", {
        "kafka1": {"host": "b1:9092", "protocol": "kafka",
                   "title": "Kafka (broker URL kafka://b1:9092,b2:9092)"},
        "kafka2": {"host": "b2:9092", "protocol": "kafka",
                   "title": "Kafka (broker URL kafka://b1:9092,b2:9092)"}}),
])
def test_servers_name_the_brokers_hosts_and_never_its_secrets(
        url: str, servers: dict[str, dict[str, str]]) -> None:
    document = build_asyncapi(broker=url)
    assert_valid_asyncapi(document)
    assert {key: {k: v for k, v in server.items() if k in ("host", "protocol", "pathname", "title")}
            for key, server in document["servers"].items()} == servers
    assert "hunter2secret" not in json.dumps(document)


def test_an_in_process_broker_has_no_servers_and_a_foreign_url_is_refused() -> None:
    document = build_asyncapi(broker="memory://")
    assert "servers" not in document
    assert_valid_asyncapi(document)
    with pytest.raises(ConfigError, match="cannot document the servers of 'http://u:\\*\\*\\*@h/'"):
        build_asyncapi(broker="http://u:hunter2secret@h/")


def test_cli_takes_the_broker_from_the_option_or_the_environment(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEBATEBUS_BROKER", "redis://:hunter2secret@from-env:6379/0")
    assert main(["asyncapi", "--format", "json"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed)["servers"]["redisStreams"]["host"] == "from-env:6379"
    assert "hunter2secret" not in printed
    assert main(["asyncapi", "--format", "json", "--broker", "kafka://k:9092"]) == 0
    assert set(json.loads(capsys.readouterr().out)["servers"]) == {"kafka"}
