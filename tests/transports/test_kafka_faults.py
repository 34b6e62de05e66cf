"""Kafka under faults, on a real Tansu broker: records too large to produce, deliveries released
or requeued, forged delivery counts, a graceful shutdown with deliveries in flight, and a broker
killed and restarted on the same port.

Tansu has no broker-side size limit (it took a 15 MB record with max.message.bytes=1000), so the
broker's refusal is checked against the error mapping alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError
from tests.support.servers import TansuServer
from tests.support.transports import GROUP_OPTIONS, WAIT, Reader, committed

from debatebus.exceptions import MessageTooLargeError, TransportError
from debatebus.transports._base import DELIVERIES_HEADER, Delivery, Outgoing, dlq_topic
from debatebus.transports.kafka import KafkaTransport
from debatebus.transports.kafka._errors import producing

pytestmark = pytest.mark.kafka


async def records_in(t: KafkaTransport, topic: str) -> int:
    """How many records ``topic`` holds: a requeue must not have appended copies."""
    return len([d async for d in t.read_range(topic)])


# -- records too large --------------------------------------------------------------------------


async def test_too_large_result_raises_and_leaves_the_delivery_unsettled(
        make: Callable[..., KafkaTransport], topic: str, tansu_server: TansuServer,
        group: str) -> None:
    results = f"event:{topic}:completed"
    async with make(partitions=1, max_request_size=10_000) as t:
        await t.ensure_topics([topic, results])
        listener = Reader(await t.subscribe([results]))
        await t.publish(Outgoing(topic, b'{"requestId":"r-1"}', key="r-1"))
        reader = Reader(t.consume([topic], group=group, consumer="c1"))
        got = await reader.next(WAIT)
        small, big = Outgoing(results, b"ok-part", key="r-1"), Outgoing(results, b"x" * 20_000)
        with pytest.raises(MessageTooLargeError) as caught:
            await t.ack(got, [small, big])
        assert caught.value.limit == 10_000
        assert caught.value.size > 20_000
        assert str(caught.value.size) in str(caught.value) and "10000" in str(caught.value)
        assert await committed(tansu_server, group, topic) is None  # still unsettled
        # The call failed whole: not even the small result went out (it would be on the results
        # partition of key r-1 before this sentinel).
        await t.publish(Outgoing(results, b"sentinel", key="r-1"))
        assert (await listener.next(WAIT)).body == b"sentinel"

        await t.ack(got, [Outgoing(results, b'{"failed":"too large"}', key="r-1")])
        assert (await listener.next(WAIT)).body == b'{"failed":"too large"}'
        assert await committed(tansu_server, group, topic) == 1
        reader.stop()
        listener.stop()


async def test_too_large_publish_and_dead_letter_raise(make: Callable[..., KafkaTransport],
                                                       topic: str, tansu_server: TansuServer,
                                                       group: str) -> None:
    async with make(partitions=1) as big, make(partitions=1, max_request_size=5_000) as small:
        await big.ensure_topics([topic, dlq_topic(topic)])
        with pytest.raises(MessageTooLargeError, match="max_request_size"):
            await small.publish(Outgoing(topic, b"y" * 6_000))
        await big.publish(Outgoing(topic, b"z" * 8_000, key="r-big"))  # another producer's limit
        reader = Reader(small.consume([topic], group=group, consumer="c1"))
        got = await reader.next(WAIT)
        with pytest.raises(MessageTooLargeError) as caught:
            await small.reject(got, "over the worker's max_message_bytes")
        assert caught.value.limit == 5_000
        assert await committed(tansu_server, group, topic) is None
        await small.ack(got)  # settled another way: the offset moves on
        assert await committed(tansu_server, group, topic) == 1
        reader.stop()


@pytest.mark.parametrize("refusal", [MessageSizeTooLargeError, RecordListTooLargeError])
def test_broker_refusing_a_record_as_too_large_is_message_too_large(refusal: type) -> None:
    with pytest.raises(MessageTooLargeError, match="the broker refused it") as caught, \
            producing("debate.request", "b:9092", size=900_000, limit=1_048_576):
        raise refusal()
    assert (caught.value.size, caught.value.limit) == (900_000, 1_048_576)
    assert isinstance(caught.value.__cause__, refusal)


# -- redelivery without copies --------------------------------------------------------------------


async def test_release_hands_the_record_out_again_without_blocking_the_partition(
        make: Callable[..., KafkaTransport], topic: str, tansu_server: TansuServer,
        group: str) -> None:
    async with make(partitions=1) as t:
        await t.ensure_topics([topic])
        for i in range(3):
            await t.publish(Outgoing(topic, f"m{i}".encode()))
        reader = Reader(t.consume([topic], group=group, consumer="c1", prefetch=3))
        d0, d1, d2 = [await reader.next(WAIT) for _ in range(3)]
        t.release(d0)
        t.release(d0)  # twice: still handed out once more, not twice
        again = await reader.next(WAIT)
        assert (again.id, again.body, again.deliveries) == (d0.id, b"m0", 2)
        await reader.nothing(0.5)
        await t.ack(d1)
        await t.ack(d2)
        assert await committed(tansu_server, group, topic) is None  # m0 holds the commit back
        await t.ack(again)
        assert await committed(tansu_server, group, topic) == 3
        assert await records_in(t, topic) == 3  # no copy was appended
        reader.stop()


async def test_requeue_redelivers_locally_and_counts(make: Callable[..., KafkaTransport],
                                                     topic: str, tansu_server: TansuServer,
                                                     group: str) -> None:
    async with make(partitions=1) as t:
        await t.ensure_topics([topic])
        await t.publish(Outgoing(topic, b"crashy"))
        reader = Reader(t.consume([topic], group=group, consumer="c1"))
        got = await reader.next(WAIT)
        for expected in (2, 3, 4):
            await t.reject(got, "handler raised", requeue=True)
            got = await reader.next(WAIT)
            assert (got.body, got.deliveries) == (b"crashy", expected)
        await t.ack(got)
        assert await committed(tansu_server, group, topic) == 1
        assert await records_in(t, topic) == 1
        reader.stop()


async def test_forged_delivery_count_header_is_ignored_and_not_dead_lettered(
        make: Callable[..., KafkaTransport], topic: str, group: str) -> None:
    async with make(partitions=1) as t:
        await t.ensure_topics([topic, dlq_topic(topic)])
        dead = Reader(await t.subscribe([dlq_topic(topic)]))
        await t.publish(Outgoing(topic, b"forged", headers={DELIVERIES_HEADER: "999"}))
        reader = Reader(t.consume([topic], group=group, consumer="c1"))
        got = await reader.next(WAIT)
        assert got.deliveries == 1
        assert DELIVERIES_HEADER not in got.headers  # so a replay of it does not carry it
        await t.reject(got, "bad input")
        letter = await dead.next(WAIT)
        assert letter.body == b"forged"
        assert DELIVERIES_HEADER not in letter.headers
        reader.stop()
        dead.stop()


# -- graceful shutdown ---------------------------------------------------------------------------


async def test_acks_after_the_iterator_closed_commit_so_nothing_is_redelivered(
        make: Callable[..., KafkaTransport], topic: str, tansu_server: TansuServer,
        group: str) -> None:
    results = f"event:{topic}:completed"
    t = make()
    await t.connect()
    await t.ensure_topics([topic, results])
    for i in range(8):
        await t.publish(Outgoing(topic, f"r{i}".encode(), key=f"r{i}"))
    reader = Reader(t.consume([topic], group=group, consumer="w1", prefetch=8))
    inflight = [await reader.next(WAIT) for _ in range(8)]
    reader.stop()  # SIGTERM: the worker stops consuming, then drains
    await asyncio.sleep(0.5)
    for d in inflight:
        await t.ack(d, [Outgoing(results, d.body, key=d.key)])
    await t.close()  # after the drain: commits, then leaves the group
    assert sum([await committed(tansu_server, group, topic, p) or 0 for p in range(3)]) == 8

    # Nothing is answered twice: a successor starts at the committed offsets, so a sentinel behind
    # each request (same key, same partition) is the first thing it reads on every partition.
    async with make() as successor:
        for i in range(8):
            await successor.publish(Outgoing(topic, b"sentinel", key=f"r{i}"))
        reader = Reader(successor.consume([topic], group=group, consumer="w2"))
        assert [(await reader.next(WAIT)).body for _ in range(8)] == [b"sentinel"] * 8
        reader.stop()


async def test_consume_again_takes_over_the_deliveries_in_flight(
        make: Callable[..., KafkaTransport], topic: str, tansu_server: TansuServer,
        group: str) -> None:
    async with make(partitions=1) as t:
        await t.ensure_topics([topic])
        await t.publish(Outgoing(topic, b"first"))
        reader = Reader(t.consume([topic], group=group, consumer="c1"))
        first = await reader.next(WAIT)
        reader.stop()
        await asyncio.sleep(0.2)
        again = Reader(t.consume([topic], group=group, consumer="c1"))  # e.g. after an error
        await t.publish(Outgoing(topic, b"second"))
        second = await again.next(WAIT)
        assert (second.body, second.deliveries) == (b"second", 1)
        await t.ack(first)
        await t.ack(second)
        assert await committed(tansu_server, group, topic) == 2
        again.stop()


# -- broker outage -------------------------------------------------------------------------------


@pytest.fixture
def restartable() -> Iterator[TansuServer]:
    """A private memory-only Tansu, to kill and start again on the same port."""
    server = TansuServer.start()
    try:
        yield server
    finally:
        server.stop()


async def ack_until_it_lands(t: KafkaTransport, d: Delivery, results: list[Outgoing]) -> None:
    """What the worker does: retry a failed ack with backoff."""
    for _ in range(20):
        try:
            await t.ack(d, results)
            return
        except TransportError:
            await asyncio.sleep(0.5)
    raise AssertionError(f"ack of {d.id} never landed")


async def collect(reader: Reader, t: KafkaTransport, n: int, results: str) -> list[bytes]:
    bodies = []
    for _ in range(n):
        d = await reader.next(WAIT)
        await ack_until_it_lands(t, d, [Outgoing(results, d.body, key=d.key)])
        bodies.append(d.body)
    return sorted(bodies)


async def test_tansu_killed_and_restarted_on_the_same_port(restartable: TansuServer,
                                                           topic: str, group: str) -> None:
    results = f"event:{topic}:completed"
    options = {**GROUP_OPTIONS, "request_timeout": 5.0}
    async with KafkaTransport(restartable.bootstrap, **options) as worker:
        await worker.ensure_topics([topic, results])
        reader = Reader(worker.consume([topic], group=group, consumer="w1"))
        for i in range(5):
            await worker.publish(Outgoing(topic, f"pre{i}".encode(), key=f"pre{i}"))
        assert await collect(reader, worker, 5, results) == [f"pre{i}".encode() for i in range(5)]

        restartable.kill9()  # memory storage: topics, records, groups and offsets are gone
        await asyncio.sleep(1.0)
        restartable.restart_same_port()
        await asyncio.sleep(3.0)  # the worker's group notices and rejoins; a publisher starts
        async with KafkaTransport(restartable.bootstrap, **options) as publisher:
            for i in range(6):  # from a new publisher, and from the transport that lived through
                by = publisher if i % 2 else worker
                await by.publish(Outgoing(topic, f"post{i}".encode(), key=f"post{i}"))
            post = await collect(reader, worker, 6, results)
            assert post == [f"post{i}".encode() for i in range(6)]
            # The results went to a topic the restarted broker has again, not to one it took
            # records for without knowing it (Tansu drops those when the topic is created).
            assert sorted([d.body async for d in publisher.read_range(results)]) == post
        assert not reader.task.done()  # the same consume() iterator lived through it
        reader.stop()


async def test_consume_raising_can_be_called_again(make: Callable[..., KafkaTransport],
                                                   topic: str, group: str) -> None:
    async with make(partitions=1) as t:
        await t.ensure_topics([topic])
        await t.publish(Outgoing(topic, b"one"))
        it: AsyncIterator[Delivery] = t.consume([topic], group=group, consumer="c1")
        got = await asyncio.wait_for(anext(it), WAIT)
        (member,) = t._members  # a fatal poll error, which Tansu cannot be made to give
        member.error = TransportError("Kafka: polling failed")
        with pytest.raises(TransportError):
            await asyncio.wait_for(anext(it), WAIT)
        again = t.consume([topic], group=group, consumer="c1")
        await t.publish(Outgoing(topic, b"two"))
        following = await asyncio.wait_for(anext(again), WAIT)
        assert following.body == b"two"
        await t.ack(got)
        await t.ack(following)
        await again.aclose()  # type: ignore[attr-defined]
