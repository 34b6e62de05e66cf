"""Message ids: every envelope has its own ``messageId``; ``causationId`` names the message it
answers, ``correlationId`` is carried along a chain unchanged. And ``debatebus publish`` sets them."""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import sys
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis
from tests.support.bus import make_debate, running, transport_options
from tests.support.processes import ROOT
from tests.support.servers import RedisServer

from debatebus._worker import DebateBus
from debatebus.client import BusClient, request_message
from debatebus.schemas.envelope import (
    ENVELOPE_DECODER,
    Envelope,
    completed_topic,
    new_message_id,
)
from debatebus.transports import Outgoing
from debatebus.transports._memory import MemoryBroker, MemoryTransport


@pytest.fixture(params=["memory", pytest.param("redis_streams", marks=pytest.mark.redis)])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return "memory://"
    return str(request.getfixturevalue("redis_server").url)


def _buses(url: str) -> tuple[DebateBus, BusClient]:
    """A worker app and a client on one broker (memory: a broker of this test's own, so no
    state outlives the test's event loop)."""
    if url == "memory://":
        broker = MemoryBroker()
        return DebateBus(MemoryTransport(broker)), BusClient(MemoryTransport(broker))
    return (DebateBus(url, transport_options=transport_options(url),
                      group=f"g-{uuid.uuid4().hex[:8]}"),
            BusClient(url, **transport_options(url)))


def _app(url: str, event_type: str) -> tuple[DebateBus, BusClient]:
    app, client = _buses(url)
    app.subscribe(event_type, make_debate().as_handler(durable=False))

    async def follow_up(payload: Mapping[str, Any]) -> dict[str, Any]:
        """The second consumer: reads a debate's result, publishes a follow-up."""
        return {"followUp": f"summarised {payload['debateId']}"}

    app.subscribe(completed_topic(event_type), follow_up)
    return app, client


async def _collect(client: BusClient, topics: list[str], message: Outgoing) -> dict[str, Envelope]:
    """Publish ``message``, then the first envelope seen on each of ``topics``, by topic."""
    deliveries = await client.transport.subscribe(topics)  # listening before we publish
    await client.transport.publish(message)
    seen: dict[str, Envelope] = {}
    try:
        async with asyncio.timeout(60):
            async for delivery in deliveries:
                seen.setdefault(delivery.topic, ENVELOPE_DECODER.decode(delivery.body))
                if len(seen) == len(topics):
                    return seen
    finally:
        await deliveries.aclose()  # type: ignore[attr-defined]
    raise AssertionError(f"the subscription ended with only {sorted(seen)}")


async def test_ids_chain_across_two_hops(url: str) -> None:
    event_type = f"debate:ids{uuid.uuid4().hex[:6]}"
    hop1, hop2 = completed_topic(event_type), completed_topic(completed_topic(event_type))
    request = request_message(event_type, {"input": "Monolith or not?"}, correlation_id="c-7")
    sent = ENVELOPE_DECODER.decode(request.body)
    app, client = _app(url, event_type)
    async with running(app), client:
        seen = await _collect(client, [hop1, hop2], request)
    result, follow_up = seen[hop1], seen[hop2]
    assert result.payload["debateStatus"] == "completed"
    assert follow_up.payload["followUp"] == f"summarised {sent.request_id}"
    ids = [sent.message_id, result.message_id, follow_up.message_id]
    assert all(isinstance(i, str) and len(i) == 32 for i in ids) and len(set(ids)) == 3
    assert result.causation_id == sent.message_id
    assert follow_up.causation_id == result.message_id
    assert sent.correlation_id == result.correlation_id == follow_up.correlation_id == "c-7"
    # The requestId stays the same along the chain: it names the request, not a message.
    assert sent.request_id == result.request_id == follow_up.request_id


async def test_a_request_without_message_id_is_caused_by_its_request_id() -> None:
    """A producer older than messageId (or Synkro's): the result names the requestId."""
    event_type = f"debate:old{uuid.uuid4().hex[:6]}"
    body = json.dumps({"requestId": "old-1", "payload": {"input": "Monolith or not?"}}).encode()
    hop1, hop2 = completed_topic(event_type), completed_topic(completed_topic(event_type))
    app, client = _app("memory://", event_type)
    async with running(app), client:  # both hops: nothing is left in flight when the app stops
        seen = await _collect(client, [hop1, hop2], Outgoing(event_type, body))
    result = seen[hop1]
    assert result.causation_id == "old-1" and result.correlation_id == "old-1"
    assert result.message_id is not None and result.message_id != "old-1"
    assert seen[hop2].causation_id == result.message_id


def test_message_ids_are_random_uuids_in_hex() -> None:
    ids = [new_message_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for made in ids:
        parsed = uuid.UUID(hex=made)
        assert (parsed.hex, parsed.version, parsed.variant) == (made, 4, uuid.RFC_4122)


def test_old_envelopes_decode_and_new_ones_carry_the_field() -> None:
    old = ENVELOPE_DECODER.decode(b'{"requestId": "r", "payload": {}}')
    assert old.message_id is None
    encoded = json.loads(request_message("debate:request", {"input": "x"}).body)
    assert len(encoded["messageId"]) == 32
    # Readers that predate the field ignore it (msgspec's default for unknown fields).
    class OldEnvelope(msgspec.Struct, rename="camel"):
        request_id: str
        payload: dict[str, Any]

    assert msgspec.json.decode(json.dumps(encoded), type=OldEnvelope).request_id


# ---- the CLI ----------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "debatebus", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


async def _sent(redis_url: str, stream: str) -> dict[str, Any]:
    client = Redis.from_url(redis_url)
    try:
        [(_, fields)] = await client.xrange(stream)
    finally:
        await client.aclose()
    return dict(json.loads(fields[b"envelope"]))


@pytest.mark.redis
async def test_publish_sets_correlation_id_and_headers(redis_server: RedisServer) -> None:
    event_type = f"debate:cli{uuid.uuid4().hex[:6]}"
    out = await asyncio.to_thread(
        cli, "publish", event_type, "--input", "Should we?", "--broker", redis_server.url,
        "--correlation-id", "c-42", "--header", "traceparent=00-abc-def-01",
        "--header", "team=core=ops", "--request-id", "cli-ids-1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cli-ids-1"
    sent = await _sent(redis_server.url, event_type)
    assert sent["correlationId"] == "c-42"
    assert sent["headers"] == {"traceparent": "00-abc-def-01", "team": "core=ops"}
    assert len(sent["messageId"]) == 32


@pytest.mark.redis
async def test_publish_wait_prints_the_ids(redis_server: RedisServer) -> None:
    url = redis_server.url
    event_type = f"debate:cli{uuid.uuid4().hex[:6]}"
    app = DebateBus(url, transport_options=transport_options(url))
    app.subscribe(event_type, make_debate().as_handler(durable=False))
    async with running(app):
        out = await asyncio.to_thread(
            cli, "publish", event_type, "--input", "Should we?", "--broker", url, "--wait",
            "--correlation-id", "c-43", "--header", "team=core", "--timeout", "60")
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    sent = await _sent(url, event_type)
    assert printed["requestId"] == sent["requestId"]
    assert printed["correlationId"] == "c-43"
    assert printed["causationId"] == sent["messageId"]
    assert len(printed["messageId"]) == 32 and printed["messageId"] != sent["messageId"]
    assert printed["timestamp"].endswith("Z")
    assert printed["headers"] == {"team": "core"}
    assert printed["payload"]["debateStatus"] == "completed"


def test_a_header_without_equals_is_refused() -> None:
    out = cli("publish", "debate:request", "--input", "x", "--header", "novalue",
              "--broker", "memory://")
    assert out.returncode == 2
    assert "expected K=V" in out.stderr


async def test_every_copy_of_an_answer_to_one_request_message_has_one_message_id(url: str) -> None:
    """A result sent again for the same request message (a redelivery after a lost
    acknowledgement, a Kafka produce retried after a timeout, a replay) keeps its messageId, so a
    consumer drops the copy; another message with the same requestId is another request."""
    event_type = f"debate:copies{uuid.uuid4().hex[:6]}"
    request = request_message(event_type, {"input": "Monolith or not?"}, request_id="rq-1")
    again = request_message(event_type, {"input": "Monolith or not?"}, request_id="rq-1")
    app, client = _buses(url)
    app.subscribe(event_type, make_debate().as_handler(durable=False))  # each copy runs anew
    results: list[Envelope] = []
    async with running(app), client:
        deliveries = await client.transport.subscribe([completed_topic(event_type)])
        for message in (request, request, again):
            await client.transport.publish(message)
        async with asyncio.timeout(60):
            async for delivery in deliveries:
                results.append(ENVELOPE_DECODER.decode(delivery.body))
                if len(results) == 3:
                    break
        await deliveries.aclose()  # type: ignore[attr-defined]
    by_cause: dict[str | None, list[str | None]] = collections.defaultdict(list)
    for result in results:
        by_cause[result.causation_id].append(result.message_id)
    first, second = (ENVELOPE_DECODER.decode(m.body).message_id for m in (request, again))
    assert len(by_cause[first]) == 2 and len(set(by_cause[first])) == 1
    assert by_cause[second] != by_cause[first] and len(by_cause[second]) == 1
