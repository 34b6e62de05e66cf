"""The transport contract: every implementation must pass this suite (FastStream's tests/brokers/base)."""

from __future__ import annotations

import asyncio

import pytest
from tests.support.transports import TIMEOUT, Kind, Reader

from debatebus.exceptions import TransportError
from debatebus.transports._base import Outgoing, Transport, dlq_topic


async def test_publish_consume_keeps_body_key_and_headers(kind: Kind, transport: Transport,
                                                          topic: str) -> None:
    consumer = Reader(transport.consume([topic], group="g", consumer="c1"))
    first = await consumer.started(kind, transport, topic)
    await transport.ack(first)
    await consumer.drain_probes(transport)
    body = b'{"requestId":"r-1","payload":{"input":"\xc3\xa9t\xc3\xa9?"}}'
    await transport.publish(Outgoing(topic, body, key="r-1", headers={"content-type": "application/json"}))
    got = await consumer.next()
    assert got.topic == topic
    assert got.body == body
    if kind.metadata:
        assert got.key == "r-1"
        assert got.headers.get("content-type") == "application/json"
    assert got.deliveries == 1
    await transport.ack(got)


async def test_ack_publishes_results(kind: Kind, transport: Transport, topic: str) -> None:
    results_topic = f"event:{topic}:completed"
    listener = Reader(await transport.subscribe([results_topic]))
    consumer = Reader(transport.consume([topic], group="g", consumer="c1"))
    await listener.started(kind, transport, results_topic)
    await listener.drain_probes()
    first = await consumer.started(kind, transport, topic)
    await transport.ack(first, [Outgoing(results_topic, b'{"result":1}', key="r")])
    got = await listener.next()
    assert got.body == b'{"result":1}'
    assert got.topic == results_topic


async def test_reject_moves_original_bytes_to_dlq_with_reason(kind: Kind, transport: Transport,
                                                             topic: str) -> None:
    dead = Reader(await transport.subscribe([dlq_topic(topic)]))
    await dead.started(kind, transport, dlq_topic(topic))
    await dead.drain_probes()
    consumer = Reader(transport.consume([topic], group="g", consumer="c1"))
    first = await consumer.started(kind, transport, topic)
    await transport.reject(first, "payload.input is missing: send a string")
    got = await dead.next()
    assert got.body == first.body
    assert got.headers["x-debatebus-reason"] == "payload.input is missing: send a string"


async def test_published_before_consumer_exists_is_delivered(kind: Kind, topic: str) -> None:
    if not kind.durable:
        pytest.skip(f"{kind.name} is at-most-once: nothing is kept for absent consumers")
    async with kind.make() as t:
        await t.ensure_topics([topic])
        await t.publish(Outgoing(topic, b"early", key="k"))
        got = await Reader(t.consume([topic], group="g", consumer="c1")).next()
        assert got.body == b"early"
        await t.ack(got)


async def test_acked_message_is_not_redelivered(kind: Kind, topic: str) -> None:
    if not kind.durable:
        pytest.skip(f"{kind.name} has no redelivery")
    # A sentinel behind it (same key, so the same partition), left unsettled: the next consumer of
    # the group gets the sentinel back, and redelivery hands out what is unsettled in order, so
    # the acked message would come first if it were still there.
    async with kind.make() as t:
        await t.ensure_topics([topic])
        await t.publish(Outgoing(topic, b"once", key="k"))
        await t.publish(Outgoing(topic, b"sentinel", key="k"))
        reader = Reader(t.consume([topic], group="g", consumer="c1"))
        got = await reader.next()
        assert got.body == b"once"
        await t.ack(got)
        assert (await reader.next()).body == b"sentinel"
        reader.stop()
    async with kind.make() as t2:
        again = await Reader(t2.consume([topic], group="g", consumer="c2")).next(
            TIMEOUT + kind.redelivery_wait)
        assert again.body == b"sentinel"
        await t2.ack(again)


async def test_unsettled_message_is_redelivered_to_another_consumer(kind: Kind, topic: str) -> None:
    if not kind.durable:
        pytest.skip(f"{kind.name} has no redelivery")
    async with kind.make() as t:
        await t.ensure_topics([topic])
        await t.publish(Outgoing(topic, b"orphan"))
    dying = kind.make()
    await dying.connect()
    reader = Reader(dying.consume([topic], group="g", consumer="dies"))
    got = await reader.next()
    assert got.body == b"orphan"
    reader.stop()
    await dying.close()  # the consumer dies without settling
    async with kind.make() as t2:
        again = await Reader(t2.consume([topic], group="g", consumer="survivor")).next(
            TIMEOUT + kind.redelivery_wait)
        assert again.body == b"orphan"
        assert again.deliveries >= 2 or kind.name == "kafka"
        await t2.ack(again)


async def test_reject_with_requeue_redelivers(kind: Kind, transport: Transport, topic: str) -> None:
    if not kind.durable:
        pytest.skip(f"{kind.name} has no redelivery")
    await transport.ensure_topics([topic])
    await transport.publish(Outgoing(topic, b"again"))
    consumer = Reader(transport.consume([topic], group="g", consumer="c1"))
    got = await consumer.next()
    await transport.reject(got, "try later", requeue=True)
    again = await consumer.next(TIMEOUT + kind.redelivery_wait)
    assert again.body == b"again"
    await transport.ack(again)


async def test_subscription_is_listening_when_subscribe_returns(kind: Kind, transport: Transport,
                                                                topic: str) -> None:
    """What is published right after ``await subscribe()`` returns is never missed."""
    await transport.ensure_topics([topic])
    for i in range(3):
        subscription = await transport.subscribe([topic])
        await transport.publish(Outgoing(topic, f"first-{i}".encode()))
        reader = Reader(subscription)
        got = await reader.next()
        assert got.body == f"first-{i}".encode()
        reader.stop()


async def test_group_members_share_messages(kind: Kind, topic: str) -> None:
    if not kind.groups:
        pytest.skip(f"{kind.name} fans every message out to every subscriber")
    n = 20
    async with kind.make() as a, kind.make() as b:
        await a.ensure_topics([topic])
        seen: list[bytes] = []

        async def run(t: Transport, name: str) -> None:
            async for d in t.consume([topic], group="g", consumer=name):
                seen.append(d.body)
                await t.ack(d)

        tasks = [asyncio.create_task(run(a, "a")), asyncio.create_task(run(b, "b"))]
        for i in range(n):
            await a.publish(Outgoing(topic, str(i).encode(), key=str(i)))
        for _ in range(int(TIMEOUT * 10)):
            if len(seen) >= n:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        for task in tasks:
            task.cancel()
        assert sorted(seen, key=int) == [str(i).encode() for i in range(n)]


async def test_unreachable_broker_raises_transport_error(kind: Kind) -> None:
    if kind.name == "memory":
        pytest.skip("the memory broker is always reachable")
    from tests.support.servers import free_port

    port = free_port()
    url = {"redis_streams": f"redis://127.0.0.1:{port}/0",
           "redis_pubsub": f"redis+pubsub://127.0.0.1:{port}/0",
           "kafka": f"kafka://127.0.0.1:{port}"}[kind.name]
    from debatebus.transports import transport_from_url

    t = transport_from_url(url, connect_timeout=2.0)

    async def connect_and_publish() -> None:
        await t.connect()
        await t.publish(Outgoing("x:y", b"z"))

    try:
        with pytest.raises(TransportError):
            await asyncio.wait_for(connect_and_publish(), 30)
    finally:
        await t.close()
