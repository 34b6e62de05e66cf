"""Clients the project did not write talk to a running worker: redis-cli on Redis Streams and
Redis pub/sub (Synkro's wire), confluent-kafka on Kafka."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis
from tests.support.bus import app_for, running


def redis_cli(port: int, *args: str) -> str:
    out = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True,
                         timeout=30, check=True)
    return out.stdout


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


async def test_redis_cli_request_and_result_on_streams(redis_server: Any) -> None:
    event_type = f"debate:cli{uuid.uuid4().hex[:6]}"
    port = _port(redis_server.url)
    envelope = json.dumps({"requestId": "cli-1", "payload": {"input": "Monolith or not?"}})
    async with running(app_for(redis_server.url, event_type)):
        await asyncio.to_thread(redis_cli, port, "XADD", event_type, "*", "envelope", envelope)
        result_stream = f"event:{event_type}:completed"
        deadline = time.monotonic() + 60
        raw = ""
        while time.monotonic() < deadline and "cli-1" not in raw:
            await asyncio.sleep(0.1)
            raw = await asyncio.to_thread(redis_cli, port, "--raw", "XRANGE", result_stream, "-", "+")
    lines = raw.splitlines()
    result = json.loads(lines[lines.index("envelope") + 1])
    assert result["requestId"] == "cli-1"
    assert result["causationId"] == "cli-1"
    assert result["payload"]["debateStatus"] == "completed"
    assert result["payload"]["debateOutput"]


async def test_an_entry_without_an_envelope_field_is_dead_lettered_naming_its_fields(
        redis_server: Any) -> None:
    event_type = f"debate:cli{uuid.uuid4().hex[:6]}"
    port = _port(redis_server.url)
    envelope = json.dumps({"requestId": "cli-2", "payload": {"input": "Monolith or not?"}})
    client = Redis.from_url(redis_server.url)
    try:
        async with running(app_for(redis_server.url, event_type)):
            await asyncio.to_thread(redis_cli, port, "XADD", event_type, "*", "data", envelope)
            reply: Any = await client.xread({f"{event_type}:dlq": "0"}, count=1, block=60_000)
    finally:
        await client.aclose()
    ((_, ((_, fields),)),) = reply
    assert fields[b"reason"].decode() == (
        "stream entry has fields ['data'], expected 'envelope' holding the JSON envelope: "
        'XADD <stream> * envelope \'{"requestId": "<id>", "payload": {…}}\' '
        "(Synkro's producers PUBLISH instead: serve them on redis+pubsub://)")


async def test_an_entry_without_an_envelope_field_but_a_request_id_is_answered_failed(
        redis_server: Any) -> None:
    event_type = f"debate:cli{uuid.uuid4().hex[:6]}"
    port = _port(redis_server.url)
    client = Redis.from_url(redis_server.url)
    try:
        async with running(app_for(redis_server.url, event_type)):
            await asyncio.to_thread(redis_cli, port, "XADD", event_type, "*", "requestId", "cli-3",
                                    "payload", '{"input": "Monolith or not?"}')
            reply: Any = await client.xread({f"event:{event_type}:failed": "0"}, count=1,
                                            block=60_000)
    finally:
        await client.aclose()
    ((_, ((_, fields),)),) = reply
    result = json.loads(fields[b"envelope"])
    assert result["requestId"] == "cli-3"
    assert result["payload"]["debateError"].startswith(
        "stream entry has fields ['requestId', 'payload'], expected 'envelope'")


async def test_synkro_wire_on_pubsub_with_redis_cli(redis_server: Any) -> None:
    """A debate without moderator, as Synkro's ``createDebate(...).asHandler()`` answers it: no
    ``debateSynthesis`` key (Synkro leaves it out when there is none), the output the last
    round's texts joined by a blank line. The full Synkro wire is tested in tests/synkro/."""
    event_type = f"debate:synkro{uuid.uuid4().hex[:6]}"
    port = _port(redis_server.url)
    url = redis_server.url.replace("redis://", "redis+pubsub://")
    listener = await asyncio.to_thread(
        subprocess.Popen,
        ["redis-cli", "-p", str(port), "--raw", "SUBSCRIBE", f"event:{event_type}:completed"],
        stdout=subprocess.PIPE, text=True)
    app = app_for(url, event_type, handler_options={"debate": {"moderator": None}})
    try:
        async with running(app):
            envelope = json.dumps({"requestId": "synkro-1", "payload": {"input": "Adopt Kafka?"}})
            for _ in range(100):  # at-most-once: repeat until the worker has subscribed
                if int(await asyncio.to_thread(redis_cli, port, "PUBLISH", event_type, envelope)):
                    break
                await asyncio.sleep(0.1)
            line = await asyncio.wait_for(asyncio.to_thread(_first_json_line, listener), 60)
    finally:
        listener.kill()
    result = json.loads(line)
    assert result["requestId"] == "synkro-1"
    payload = result["payload"]
    assert payload["debateStatus"] == "completed"
    assert set(payload) >= {"debateOutput", "debateRounds", "debateStatus",
                            "debateTokenUsage"}  # Synkro's names
    assert "debateSynthesis" not in payload
    last = payload["debateTranscript"][-1]["turns"]
    assert payload["debateOutput"] == "\n\n".join(t["text"] for t in last)


def _first_json_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            return line
    raise AssertionError("redis-cli SUBSCRIBE ended without a message")


@pytest.mark.kafka
async def test_confluent_kafka_request_and_result(tansu_server: Any) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    event_type = f"debate:ck{uuid.uuid4().hex[:6]}"
    bootstrap = tansu_server.bootstrap
    async with running(app_for(tansu_server.url, event_type)):
        await asyncio.sleep(0.5)  # the worker creates its topics before consuming

        def produce() -> None:
            producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
            value = json.dumps({"requestId": "ck-1", "payload": {"input": "Adopt Kafka?"}})
            producer.produce(event_type.replace(":", "."), value.encode(), key=b"ck-1")
            assert producer.flush(30) == 0

        await asyncio.to_thread(produce)
        result = await asyncio.to_thread(_confluent_result, confluent_kafka, bootstrap,
                                         f"event.{event_type.replace(':', '.')}.completed")
    assert result.key() == b"ck-1"
    body = json.loads(result.value())
    assert body["requestId"] == "ck-1"
    assert body["payload"]["debateStatus"] == "completed"


def _confluent_result(confluent_kafka: Any, bootstrap: str, topic: str) -> Any:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "foreign",
                                         "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            metadata = consumer.list_topics(topic, timeout=5).topics.get(topic)
            if metadata is not None and metadata.error is None and metadata.partitions:
                break
            time.sleep(0.2)
        consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                         for p in metadata.partitions])
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                return message
    finally:
        consumer.close()
    raise AssertionError(f"confluent-kafka read no result from {topic}")
