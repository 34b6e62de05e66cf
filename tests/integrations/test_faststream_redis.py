"""The FastStream host on a real Redis, fed by foreign clients: redis-cli, a FastStream producer
on its default format, and debatebus's own BusClient; pub/sub and Streams."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from faststream.redis import RedisBroker, StreamSub
from redis.asyncio import Redis

from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.client import BusClient, request_message
from debatebus.handlers._contract import Handler
from debatebus.integrations.faststream import mount
from tests.support.faststream import counting_llm, debate, request
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.redis,
              pytest.mark.skipif(shutil.which("redis-cli") is None, reason="needs redis-cli")]


@pytest.fixture
def event() -> str:
    return f"debate:request{uuid.uuid4().hex[:8]}"


@contextlib.asynccontextmanager
async def hosted(url: str, source: str | StreamSub[Any], handler: Handler,
                 **options: Any) -> AsyncIterator[None]:
    """A FastStream app hosting ``handler``; on a channel, once it is subscribed."""
    broker = RedisBroker(url)
    mount(broker, source, handler, **options)
    async with broker:
        await broker.start()
        if isinstance(source, str):
            client = await broker.connect()
            async with asyncio.timeout(10):
                while (await client.pubsub_numsub(source))[0][1] == 0:  # noqa: ASYNC110 - polling Redis
                    await asyncio.sleep(0.02)
        yield


async def redis_cli(server: RedisServer, *args: str | bytes) -> None:
    proc = await asyncio.create_subprocess_exec("redis-cli", "-p", str(server.port), *args,
                                                stdout=asyncio.subprocess.DEVNULL)
    assert await proc.wait() == 0


async def stream_entries(client: Redis, stream: str, count: int) -> list[dict[bytes, bytes]]:
    """The first ``count`` entries of ``stream``, waiting up to 10 s for them."""
    async with asyncio.timeout(10):
        while len(entries := await client.xrange(stream)) < count:  # noqa: ASYNC110 - polling Redis
            await asyncio.sleep(0.02)
    return [fields for _, fields in entries]


async def pending_once_acked(client: Redis, stream: str, group: str) -> int:
    """How many of ``stream``'s entries ``group`` has not acknowledged, once none or after 10 s:
    FastStream acknowledges after the handler returns, so the last ack may still be on its way."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while (pending := (await client.xpending(stream, group))["pending"]) \
            and loop.time() < deadline:  # noqa: ASYNC110 - polling Redis
        await asyncio.sleep(0.02)
    return int(pending)


async def test_pubsub_request_duplicate_bad_input_and_dead_letter(redis_server: RedisServer,
                                                                   event: str) -> None:
    llm = counting_llm()
    client = Redis(port=redis_server.port)
    listener = client.pubsub()
    await listener.subscribe(f"event:{event}:completed", f"event:{event}:failed")

    async def next_result() -> tuple[str, dict[str, Any]]:
        async with asyncio.timeout(10):
            while (msg := await listener.get_message(ignore_subscribe_messages=True,
                                                     timeout=1)) is None:
                pass
        return msg["channel"].decode(), json.loads(msg["data"])  # plain JSON on the wire

    async with hosted(redis_server.url, event, debate(llm).as_handler(store=MemoryCheckpointStore())):
        await redis_cli(redis_server, "PUBLISH", event, request("p1", input="Tabs or spaces?"))
        channel, first = await next_result()
        assert channel == f"event:{event}:completed" and first["requestId"] == "p1"
        assert first["payload"]["debateStatus"] == "completed"
        calls = len(llm.requests)
        await redis_cli(redis_server, "PUBLISH", event, request("p1", input="Tabs or spaces?"))
        _, again = await next_result()
        assert again["payload"]["debateReplayed"] is True and len(llm.requests) == calls
        await redis_cli(redis_server, "PUBLISH", event, request("p2"))
        channel, failed = await next_result()
        assert channel == f"event:{event}:failed" and failed["requestId"] == "p2"
        await redis_cli(redis_server, "PUBLISH", event, "not json")
        (dead,) = await stream_entries(client, f"{event}:dlq", 1)
    assert dead[b"envelope"] == b"not json" and dead[b"origin"] == event.encode()
    assert b"not valid JSON" in dead[b"reason"]
    await listener.aclose()
    await client.aclose()


async def test_streams_request_duplicate_bad_input_and_dead_letter(redis_server: RedisServer,
                                                                    event: str) -> None:
    llm = counting_llm()
    client = Redis(port=redis_server.port)
    completed, failed = f"event:{event}:completed", f"event:{event}:failed"
    source = StreamSub(event, group="debatebus", consumer="w1", last_id="0")
    handler = debate(llm).as_handler(store=MemoryCheckpointStore())
    await redis_cli(redis_server, "XADD", event, "*", "envelope", request("s1", input="Tabs?"))
    async with hosted(redis_server.url, source, handler):  # the entry was there before it
        (first,) = await stream_entries(client, completed, 1)
        calls = len(llm.requests)
        await redis_cli(redis_server, "XADD", event, "*", "envelope", request("s1", input="Tabs?"))
        _, again = await stream_entries(client, completed, 2)
        await redis_cli(redis_server, "XADD", event, "*", "envelope", request("s2"))
        (bad,) = await stream_entries(client, failed, 1)
        await redis_cli(redis_server, "XADD", event, "*", "envelope", "{")
        (dead,) = await stream_entries(client, f"{event}:dlq", 1)
        pending = await pending_once_acked(client, event, "debatebus")  # acks follow answers
    assert first[b"key"] == b"s1"
    assert json.loads(first[b"envelope"])["payload"]["debateStatus"] == "completed"
    assert json.loads(again[b"envelope"])["payload"]["debateReplayed"] is True
    assert len(llm.requests) == calls  # the duplicate was answered from the store
    assert json.loads(bad[b"envelope"])["requestId"] == "s2"
    assert dead[b"envelope"] == b"{" and dead[b"origin"] == event.encode()
    assert pending == 0  # every request acknowledged
    await client.aclose()


async def test_streams_host_reads_faststream_producers_and_answers_busclient(
        redis_server: RedisServer, event: str) -> None:
    """A FastStream producer on its defaults (``__data__``, binary format) is read too, and
    debatebus's own client gets its answer on the field it reads (``envelope``)."""
    handler = debate(counting_llm()).as_handler(store=MemoryCheckpointStore())
    source = StreamSub(event, group="debatebus", consumer="w1")
    async with hosted(redis_server.url, source, handler), \
            BusClient(redis_server.url) as bus, RedisBroker(redis_server.url) as producer:
        answer = await bus.request(event, {"input": "Tabs or spaces?"}, timeout=20)
        assert answer.payload["debateStatus"] == "completed"
        await producer.publish(request("f1", input="Tabs?"), stream=event)
        client = Redis(port=redis_server.port)
        entries = await stream_entries(client, f"event:{event}:completed", 2)
        await client.aclose()
    assert json.loads(entries[1][b"envelope"])["requestId"] == "f1"


async def test_pubsub_host_answers_busclient(redis_server: RedisServer, event: str) -> None:
    handler = debate(counting_llm()).as_handler(store=MemoryCheckpointStore())
    async with hosted(redis_server.url, event, handler), \
            BusClient(redis_server.url.replace("redis://", "redis+pubsub://")) as bus:
        answer = await bus.request(event, {"input": "Tabs or spaces?"}, timeout=20)
    assert answer.payload["debateStatus"] == "completed"


async def test_300_handlers_finishing_at_once_all_publish_and_ack(redis_server: RedisServer,
                                                                  event: str) -> None:
    """300 requests handled at once (``max_workers=300``) finish together: their results are
    written a bounded number at a time, not one pool connection each (redis-py's pool holds 100:
    201 results failed, and their requests stayed pending)."""
    n, in_flight, everyone_in = 300, 0, asyncio.Event()

    async def handler(payload: dict[str, Any]) -> dict[str, Any]:
        nonlocal in_flight
        in_flight += 1
        if in_flight == n:
            everyone_in.set()
        await asyncio.wait_for(everyone_in.wait(), 30)
        return {**payload, "debateStatus": "completed"}

    client = Redis(port=redis_server.port)
    source = StreamSub(event, group="debatebus", consumer="w1", last_id="0")
    for i in range(n):
        await client.xadd(event, {b"envelope": request_message(event, {"input": f"q{i}"},
                                                               request_id=f"r{i}").body})
    async with hosted(redis_server.url, source, handler, subscriber_options={"max_workers": n}):
        results = await stream_entries(client, f"event:{event}:completed", n)
        assert await pending_once_acked(client, event, "debatebus") == 0
    assert in_flight == n
    assert sorted(json.loads(r[b"envelope"])["requestId"] for r in results) == sorted(
        f"r{i}" for i in range(n))
    await client.aclose()
