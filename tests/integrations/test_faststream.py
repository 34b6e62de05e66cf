"""The FastStream host in memory: FastStream's TestRedisBroker / TestKafkaBroker, no server."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import pytest
from faststream import Context
from faststream.kafka import KafkaBroker, TestKafkaBroker
from faststream.message import StreamMessage
from faststream.redis import BinaryMessageFormatV1, RedisBroker, StreamSub
from faststream.redis.testing import PEL, TestRedisBroker

from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.exceptions import ConfigError
from debatebus.integrations.faststream import mount
from debatebus.integrations.faststream._host import raw_body
from debatebus.integrations.faststream._redis_host import JSONMessageFormat
from tests.support.faststream import counting_llm, debate, request

EVENT = "debate:request"
COMPLETED, FAILED = f"event:{EVENT}:completed", f"event:{EVENT}:failed"


class HeaderlessPEL(PEL):
    """TestRedisBroker's pending list, for bodies without FastStream's headers: it files a
    message under the correlation id it published with, and looks it up by the one the parsed
    message carries, which a plain JSON body cannot keep (a real Redis has no such list)."""

    def _remove(self, correlation_id: Any) -> None:
        self.entries.pop(correlation_id, None)


def in_memory(broker: RedisBroker) -> TestRedisBroker[RedisBroker]:
    return TestRedisBroker(broker, pel=HeaderlessPEL())


class Results:
    """What the broker published on the completed and failed channels, as raw bodies."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[bytes]] = {COMPLETED: [], FAILED: []}

    def on(self, topic: str) -> Any:
        async def got(message: Annotated[StreamMessage[Any], Context("message")]) -> None:
            self.bodies[topic].append(message.body)

        return got

    def envelopes(self, topic: str) -> list[dict[str, Any]]:
        return [json.loads(body) for body in self.bodies[topic]]


def collect(broker: RedisBroker, *, stream: bool) -> Results:
    results = Results()
    for topic in (COMPLETED, FAILED):
        sub = (broker.subscriber(stream=topic, message_format=JSONMessageFormat, decoder=raw_body)
               if stream else
               broker.subscriber(topic, message_format=JSONMessageFormat, decoder=raw_body))
        sub(results.on(topic))
    return results


@pytest.mark.parametrize("stream", [False, True], ids=["pubsub", "stream"])
async def test_request_bad_input_and_duplicate_on_test_redis_broker(stream: bool) -> None:
    llm, store = counting_llm(), MemoryCheckpointStore()
    broker = RedisBroker()
    source: str | StreamSub[Any] = StreamSub(EVENT) if stream else EVENT
    # TestRedisBroker routes FastStream's own publishes: the stream field is FastStream's here
    mount(broker, source, debate(llm).as_handler(store=store), stream_field="__data__")
    results = collect(broker, stream=stream)
    target = {"stream": EVENT} if stream else {"channel": EVENT}
    async with in_memory(broker) as test:
        await test.publish(request("r1", input="Tabs or spaces?"), **target)
        calls = len(llm.requests)
        await test.publish(request("r1", input="Tabs or spaces?"), **target)
        await test.publish(request("r2", input=""), **target)
    first, again = results.envelopes(COMPLETED)
    assert first["requestId"] == "r1" and first["type"] == COMPLETED
    assert first["payload"]["debateStatus"] == "completed" and first["payload"]["debateRounds"] >= 1
    assert first["causationId"] == "r1" and first["correlationId"] == "r1"
    assert calls > 0 and len(llm.requests) == calls  # the duplicate made no LLM call
    assert again["payload"]["debateReplayed"] is True
    assert again["payload"]["debateOutput"] == first["payload"]["debateOutput"]
    (failed,) = results.envelopes(FAILED)
    assert failed["requestId"] == "r2" and failed["payload"]["debateStatus"] == "failed"
    assert "input" in failed["payload"]["debateError"]
    # the wire is plain JSON both ways, never FastStream's binary format
    assert all(body.startswith(b"{") for bodies in results.bodies.values() for body in bodies)


async def test_an_envelope_that_fails_the_schema_is_a_failed_event() -> None:
    broker = RedisBroker()
    mount(broker, EVENT, debate(counting_llm()).as_handler(durable=False))
    results = collect(broker, stream=False)
    async with in_memory(broker) as test:
        await test.publish(b'{"requestId": "r3", "payload": "not an object"}', channel=EVENT)
    (failed,) = results.envelopes(FAILED)
    assert failed["requestId"] == "r3" and "schema" in failed["payload"]["debateError"]


async def test_a_plain_async_function_is_a_handler_too() -> None:
    async def shout(payload: Any) -> dict[str, Any]:
        return {**payload, "debateOutput": str(payload["input"]).upper()}

    broker = RedisBroker()
    mount(broker, EVENT, shout)
    results = collect(broker, stream=False)
    async with in_memory(broker) as test:
        await test.publish(request("r4", input="hello"), channel=EVENT)
    (done,) = results.envelopes(COMPLETED)
    assert done["payload"]["debateOutput"] == "HELLO"


def test_json_format_reads_json_and_faststream_binary_bodies() -> None:
    body = request("r5", input="q")
    assert JSONMessageFormat.parse(body) == (body, {})
    wrapped = asyncio.run(BinaryMessageFormatV1.encode(
        message=body, reply_to=None, headers=None, correlation_id="c"))
    assert wrapped.startswith(BinaryMessageFormatV1.IDENTITY_HEADER)
    assert JSONMessageFormat.parse(wrapped)[0] == body
    assert asyncio.run(JSONMessageFormat.encode(
        message=body, reply_to=None, headers={"h": "v"}, correlation_id="c")) == body


async def test_kafka_request_and_bad_input_on_test_kafka_broker() -> None:
    llm = counting_llm()
    broker = KafkaBroker()
    mount(broker, EVENT, debate(llm).as_handler(store=MemoryCheckpointStore()))
    seen: dict[str, list[StreamMessage[Any]]] = {"completed": [], "failed": []}

    def keep(kind: str) -> Any:
        async def got(message: Annotated[StreamMessage[Any], Context("message")]) -> None:
            seen[kind].append(message)

        return got

    for kind in seen:
        broker.subscriber(f"event.debate.request.{kind}", decoder=raw_body)(keep(kind))
    async with TestKafkaBroker(broker) as test:
        await test.publish(request("k1", input="Tabs or spaces?"), "debate.request", key=b"k1")
        await test.publish(request("k2"), "debate.request", key=b"k2")
    (done,), (failed,) = seen["completed"], seen["failed"]
    assert json.loads(done.body)["payload"]["debateStatus"] == "completed"
    assert done.raw_message.key == b"k1"
    assert done.headers["content-type"] == "application/json"
    assert json.loads(failed.body)["requestId"] == "k2"


def test_mount_refuses_what_it_cannot_host() -> None:
    with pytest.raises(ConfigError, match="RedisBroker or KafkaBroker"):
        mount(object(), EVENT, debate(counting_llm()).as_handler())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="event type"):
        mount(KafkaBroker(), StreamSub(EVENT), debate(counting_llm()).as_handler())
