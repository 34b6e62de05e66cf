"""Kafka-only guarantees beyond the contract suite, on a real Tansu broker.

A foreign client (confluent-kafka) reads and writes our wire format; commits cover only the
contiguous settled prefix; a SIGKILLed consumer's message is taken over; a consumer holding
messages past max_poll_interval_ms stays in its group; unreachable brokers raise TransportError.
No test asserts on timing: every wait has a generous deadline and checks an outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import math
import os
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import OffsetAndTimestamp, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from tests.support.servers import TansuServer, free_port
from tests.support.transports import WAIT, Reader, committed

import debatebus
from debatebus.exceptions import ConfigError, TransportError
from debatebus.transports import transport_from_url
from debatebus.transports._base import (
    DELIVERIES_HEADER,
    ORIGIN_OFFSET_HEADER,
    ORIGIN_PARTITION_HEADER,
    REASON_HEADER,
    Delivery,
    Outgoing,
    dlq_topic,
)
from debatebus.transports.kafka import SCHEMA_HEADER, KafkaTransport, kafka_topic
from debatebus.transports.kafka._offsets import Partition
from debatebus.transports.kafka._readers import time_starts

pytestmark = pytest.mark.kafka



async def eventually(check: Callable[[], Any], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {timeout}s")
        await asyncio.sleep(0.2)


# -- a client the project did not write --------------------------------------------------------


def confluent_read_one(bootstrap: str, topic: str, partitions: int) -> Any:
    import confluent_kafka

    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "foreign",
                                         "enable.auto.commit": False})
    # assign(), not subscribe(): Tansu holds a JoinGroup for about half the session timeout,
    # which is 45 s by default in librdkafka.
    consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                     for p in range(partitions)])
    try:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                return message
        raise AssertionError(f"confluent-kafka read nothing from {topic}")
    finally:
        consumer.close()


async def test_confluent_consumer_reads_what_we_publish(kafka: KafkaTransport, topic: str,
                                                        tansu_server: TansuServer) -> None:
    body = b'{"requestId":"r-1","payload":{"input":"\xc3\xa9t\xc3\xa9?"}}'
    await kafka.publish(Outgoing(topic, body, key="r-1", headers={"x-trace": "t-9"}))
    message = await asyncio.to_thread(confluent_read_one, tansu_server.bootstrap,
                                      kafka_topic(topic), kafka.settings.partitions)
    assert message.topic() == topic.replace(":", ".")
    assert message.value() == body
    assert message.key() == b"r-1"
    headers = dict(message.headers())
    assert headers["content-type"] == b"application/json"
    assert headers[SCHEMA_HEADER] == b"1"
    assert headers["x-trace"] == b"t-9"


async def test_we_consume_what_confluent_produces(kafka: KafkaTransport, topic: str,
                                                  tansu_server: TansuServer, group: str) -> None:
    import confluent_kafka

    await kafka.ensure_topics([topic])  # or Tansu would auto-create it with its own defaults
    body = b'{"requestId":"r-7","payload":{"input":"tabs or spaces?"}}'

    def produce() -> int:
        producer = confluent_kafka.Producer({"bootstrap.servers": tansu_server.bootstrap})
        producer.produce(kafka_topic(topic), value=body, key=b"r-7",
                         headers=[("content-type", b"application/json"), ("x-from", b"rdkafka")])
        return int(producer.flush(WAIT))

    assert await asyncio.to_thread(produce) == 0  # nothing left unsent
    reader = Reader(kafka.consume([topic], group=group, consumer="c1"))
    got = await reader.next(WAIT)
    assert (got.topic, got.body, got.key, got.deliveries) == (topic, body, "r-7", 1)
    assert got.headers["content-type"] == "application/json"
    assert got.headers["x-from"] == "rdkafka"
    await kafka.ack(got)
    reader.stop()


# -- commits -------------------------------------------------------------------------------------


async def test_out_of_order_acks_commit_only_the_contiguous_prefix(
        make: Callable[..., KafkaTransport], topic: str, tansu_server: TansuServer,
        group: str) -> None:
    async with make(partitions=1) as t:
        await t.ensure_topics([topic])
        for i in range(3):
            await t.publish(Outgoing(topic, f"m{i}".encode(), key=f"r{i}"))
        reader = Reader(t.consume([topic], group=group, consumer="c1", prefetch=3))
        d0, d1, d2 = [await reader.next(WAIT) for _ in range(3)]
        assert [d.id for d in (d0, d1, d2)] == ["0:0", "0:1", "0:2"]

        await t.ack(d0)
        await t.ack(d2)
        assert await committed(tansu_server, group, topic) == 1  # 1 is unsettled: 2 must wait
        await t.ack(d1)
        assert await committed(tansu_server, group, topic) == 3
        reader.stop()


def test_partition_bookkeeping_skips_offset_gaps_and_forgets_unhanded_tail() -> None:
    part = Partition()
    for offset in (5, 7, 8, 9):  # 6 is a gap (a transaction marker, a compacted record)
        part.add(offset)
    assert part.settle(7)
    assert part.commit_at is None
    assert part.settle(5)
    assert part.commit_at == 8
    assert not part.settle(5)  # settling twice changes nothing
    assert part.forget_from(9) == 1  # 9 was never handed out: the next owner gets it
    assert part.settle(8)
    assert part.commit_at == 9


def test_partition_bookkeeping_of_lent_slots() -> None:
    """Only a handed-out, unsettled record is lent; settling, handing it out again or forgetting
    it ends the loan, so a lent record never outlives its place in ``unsettled``."""
    part = Partition()
    for offset in (1, 2, 3, 4):
        part.add(offset)
    assert not part.lend(1, True)  # still in the buffer: not handed out
    for offset in (1, 2, 3, 4):
        part.hand_out(offset)
    assert part.lend(1, True) and part.lend(2, True) and part.lend(3, True) and part.lend(4, True)
    assert not part.lend(1, True)  # lent already
    assert part.lend(1, False) and not part.lend(1, False)  # taken back, once
    assert part.settle(2) and part.put_back(3) and part.forget_from(4) == 1
    assert part.lent == set()
    assert not part.lend(2, True)  # settled: nothing to lend


# -- takeover ------------------------------------------------------------------------------------

DOOMED = """
import asyncio, sys
from debatebus.transports.kafka import KafkaTransport

async def main():
    bootstrap, topic, group = sys.argv[1:4]
    async with KafkaTransport(bootstrap, session_timeout_ms=2000, heartbeat_interval_ms=500) as t:
        async for d in t.consume([topic], group=group, consumer="doomed"):
            print("got", d.body.decode(), flush=True)
            await asyncio.sleep(3600)  # a long debate, cut short by SIGKILL

asyncio.run(main())
"""


async def test_message_of_a_sigkilled_consumer_is_taken_over(
        kafka: KafkaTransport, topic: str, tansu_server: TansuServer, group: str) -> None:
    await kafka.ensure_topics([topic])
    await kafka.publish(Outgoing(topic, b"orphan", key="r-1"))
    src = str(Path(debatebus.__file__).parents[1])  # the debatebus this test runs against
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DOOMED, tansu_server.bootstrap, topic, group,
        stdout=asyncio.subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), WAIT)
        assert line.decode().strip() == "got orphan"
    finally:
        proc.kill()  # SIGKILL: no LeaveGroup, no commit; the broker must expire the member
        await proc.wait()

    reader = Reader(kafka.consume([topic], group=group, consumer="survivor"))
    again = await reader.next(WAIT)
    assert (again.body, again.key) == (b"orphan", "r-1")
    await kafka.ack(again)
    assert await committed(tansu_server, group, topic, int(again.id.split(":")[0])) == 1
    reader.stop()


# -- liveness while handlers are slow ------------------------------------------------------------


def revocations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "debatebus.transports.kafka" and "revoked" in r.getMessage()]


async def test_holding_messages_past_max_poll_interval_does_not_expel_the_consumer(
        make: Callable[..., KafkaTransport], topic: str, tansu_server: TansuServer,
        caplog: pytest.LogCaptureFixture, group: str) -> None:
    caplog.set_level(logging.INFO, logger="debatebus.transports.kafka")
    async with make(partitions=1, max_poll_interval_ms=6000) as a:
        await a.ensure_topics([topic])
        await a.publish(Outgoing(topic, b"slow-0"))
        reader = Reader(a.consume([topic], group=group, consumer="a", prefetch=1))
        held = await reader.next(WAIT)
        await a.publish(Outgoing(topic, b"slow-1"))
        # The hold: 10 s > max_poll_interval_ms. prefetch=1 keeps slow-1 back (paused partition)
        # while the fetch loop keeps polling, so the consumer stays in the group.
        await reader.nothing(10.0)
        await a.ack(held)
        assert await committed(tansu_server, group, topic) == 1  # an expelled member cannot commit
        following = await reader.next(WAIT)
        assert (following.body, following.deliveries) == (b"slow-1", 1)
        await a.ack(following)
        assert await committed(tansu_server, group, topic) == 2
        assert revocations(caplog) == [], "the consumer was rebalanced during the hold"

        reader.stop()
        await a.publish(Outgoing(topic, b"sentinel"))
    # Once it has left, the next member gets nothing already handled: it starts at the committed
    # offset, so the sentinel published after is the first thing it reads.
    async with make() as b:
        after = Reader(b.consume([topic], group=group, consumer="b"))
        assert (await after.next(WAIT)).body == b"sentinel"
        after.stop()


async def test_late_ack_after_revocation_publishes_but_does_not_commit(
        make: Callable[..., KafkaTransport], topic: str, tansu_server: TansuServer,
        caplog: pytest.LogCaptureFixture, group: str) -> None:
    caplog.set_level(logging.INFO, logger="debatebus.transports.kafka")
    results = f"event:{topic}:completed"
    async with make(partitions=1, revoke_grace_ms=300) as a, make() as b:
        await a.ensure_topics([topic, results])
        listener = Reader(await a.subscribe([results]))
        await a.publish(Outgoing(topic, b"contested", key="r-1"))
        ra = Reader(a.consume([topic], group=group, consumer="a", prefetch=1))
        held = await ra.next(WAIT)
        rb = Reader(b.consume([topic], group=group, consumer="b"))  # the join revokes a's partition

        async def revoked() -> bool:
            return bool(revocations(caplog))

        await eventually(revoked, "revoked from a")
        await a.ack(held, [Outgoing(results, b'{"late":true}', key="r-1")])
        assert (await listener.next(WAIT)).body == b'{"late":true}'
        assert await committed(tansu_server, group, topic) is None  # not a's to commit any more

        owner, again = await first_of({ra: a, rb: b})  # the partition's owner now gets it again
        assert again.body == b"contested"
        await owner.ack(again)
        assert await committed(tansu_server, group, topic) == 1
        for r in (ra, rb, listener):
            r.stop()


async def first_of(readers: dict[Reader, KafkaTransport]) -> tuple[KafkaTransport, Delivery]:
    """The next delivery from whichever reader gets one first, with its transport."""
    tasks = {asyncio.ensure_future(r.next(WAIT)): t for r, t in readers.items()}
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    task = done.pop()
    return tasks[task], task.result()


# -- settling by re-producing ----------------------------------------------------------------------


async def test_requeue_counts_deliveries_and_dlq_records_origin(
        make: Callable[..., KafkaTransport], topic: str, group: str) -> None:
    async with make(partitions=1) as t:
        await t.ensure_topics([topic])
        dead = Reader(await t.subscribe([dlq_topic(topic)]))
        await t.publish(Outgoing(topic, b"\xff not json", key="r-1", headers={"x-a": "1"}))
        reader = Reader(t.consume([topic], group=group, consumer="c1"))
        first = await reader.next(WAIT)
        await t.reject(first, "try again", requeue=True)
        second = await reader.next(WAIT)
        assert (second.body, second.key, second.deliveries) == (b"\xff not json", "r-1", 2)
        assert second.id == first.id  # the same record again, not a copy appended to the topic
        assert DELIVERIES_HEADER not in second.headers
        assert second.headers["x-a"] == "1"
        await t.reject(second, "body is not JSON: send a UTF-8 JSON envelope")
        got = await dead.next(WAIT)
        assert got.topic == dlq_topic(topic)
        assert got.body == b"\xff not json"
        assert got.headers[REASON_HEADER] == "body is not JSON: send a UTF-8 JSON envelope"
        assert (got.headers[ORIGIN_PARTITION_HEADER], got.headers[ORIGIN_OFFSET_HEADER]) == \
            ("0", second.id.split(":")[1])
        assert DELIVERIES_HEADER not in got.headers
        reader.stop()
        dead.stop()


# -- ops replay ----------------------------------------------------------------------------------


async def test_read_range_by_offsets_and_by_time(make: Callable[..., KafkaTransport],
                                                 topic: str) -> None:
    async with make(partitions=1) as t:
        await t.ensure_topics([topic])
        for i in range(5):
            await t.publish(Outgoing(topic, f"m{i}".encode()))
        by_offset = [d.body async for d in t.read_range(topic, 1, 3)]  # inclusive, like XRANGE
        assert by_offset == [b"m1", b"m2", b"m3"]
        assert [d.body async for d in t.read_range(topic)] == [f"m{i}".encode() for i in range(5)]

        await asyncio.sleep(1.1)  # record timestamps have ms resolution: split them clearly
        since = datetime.now(UTC)
        await asyncio.sleep(0.05)
        await t.publish(Outgoing(topic, b"late"))
        assert [d.body async for d in t.read_range(topic, since)] == [b"late"]
        before = since - timedelta(hours=1)
        assert len([d async for d in t.read_range(topic, before, since)]) == 5


class TimeIndex:
    """A reader over one partition whose timestamps are ``stamps`` and whose time index answers
    ``answer`` (an offset, or None for "no record that late"), right or wrong."""

    def __init__(self, stamps: list[int], answer: int | None) -> None:
        self.stamps, self.answer, self.at = stamps, answer, 0

    async def offsets_for_times(self, query: dict[TopicPartition, int]) -> dict[Any, Any]:
        hit = None if self.answer is None else OffsetAndTimestamp(self.answer, 0)
        return {tp: hit for tp in query}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.at = offset

    async def getmany(self, tp: TopicPartition, timeout_ms: int = 0) -> dict[Any, Any]:
        return {tp: [SimpleNamespace(offset=self.at, timestamp=self.stamps[self.at])]}


@pytest.mark.parametrize(("answer", "at", "start"), [
    (1, 150, 1),  # right: the record before is older, so start there
    (3, 150, 0),  # too late (Tansu): record 2 is not older than 150, so scan from the start
    (None, 500, 4),  # nothing that late, and the last record agrees: nothing to read
    (None, 250, 0),  # "nothing that late", but the last record is later: scan from the start
])
async def test_time_index_answers_are_checked(answer: int | None, at: int, start: int) -> None:
    tp = TopicPartition("t", 0)
    t = KafkaTransport("127.0.0.1:1")  # never connects: the reader is a stand-in
    reader = TimeIndex([100, 200, 300, 400], answer)
    starts = await time_starts(reader, [tp], at, {tp: 0}, {tp: 4}, servers=t.settings.servers,
                               timeout=t.settings.request_timeout)
    assert starts == {tp: start}


# -- settings -----------------------------------------------------------------------------------


def test_constructor_arguments_become_frozen_settings() -> None:
    t = KafkaTransport([" h1:9092, h2:9093", "h3:9094"], partitions=2, session_timeout_ms=4000,
                       revoke_grace_ms=1500, fetch_max_wait_ms=50)
    settings = t.settings
    assert settings.servers == "h1:9092,h2:9093,h3:9094"
    assert (settings.partitions, settings.revoke_grace) == (2, 1.5)
    assert settings.group_options["rebalance_timeout_ms"] == 5500  # session + grace
    assert settings.fetch_options == {"fetch_max_wait_ms": 50}
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.partitions = 5  # type: ignore[misc]


@pytest.mark.parametrize(("servers", "options"), [(" , ", {}), ("h:1", {"partitions": 0}),
                                                  ("h:1", {"replication_factor": 0})])
def test_bad_settings_raise_config_error(servers: str, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        KafkaTransport(servers, **options)


def test_topic_retention_from_the_constructor_and_the_url() -> None:
    assert KafkaTransport("h:1").settings.topic_configs == {"retention.ms": str(7 * 86_400_000)}
    assert KafkaTransport("h:1", topic_retention_s=2.5).settings.topic_configs == \
        {"retention.ms": "2500"}
    assert KafkaTransport("h:1", topic_retention_s=math.inf).settings.topic_configs == \
        {"retention.ms": "-1"}  # Kafka's "keep forever"
    from_url = transport_from_url("kafka://h:1?topic_retention=12h&partitions=2")
    assert isinstance(from_url, KafkaTransport)
    assert from_url.settings.topic_configs == {"retention.ms": str(12 * 3_600_000)}
    assert transport_from_url("kafka://h:1?topic_retention=never").settings.topic_configs == \
        {"retention.ms": "-1"}  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="topic_retention_s must be a positive number"):
        KafkaTransport("h:1", topic_retention_s=0)
    with pytest.raises(ConfigError, match="topic_retention='a week' in a URL"):
        transport_from_url("kafka://h:1?topic_retention=a week")


async def test_topics_are_created_with_the_retention(tansu_server: TansuServer) -> None:
    """Tansu keeps a topic's configs from its creation and describes them back."""
    event_type = f"debate:kept{uuid.uuid4().hex[:6]}"
    async with transport_from_url(f"{tansu_server.url}?topic_retention=90s") as t:
        await t.ensure_topics([event_type])
    admin = AIOKafkaAdminClient(bootstrap_servers=tansu_server.bootstrap)
    await admin.start()
    try:
        (response,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, kafka_topic(event_type))])
    finally:
        await admin.close()
    ((*_, entries),) = response.resources
    configs = {entry[0]: entry[1] for entry in entries}
    assert configs["retention.ms"] == "90000"


# -- unreachable brokers -------------------------------------------------------------------------


async def test_unreachable_broker_raises_transport_error_with_cause() -> None:
    port = free_port()  # nothing listens there
    t = KafkaTransport([f"127.0.0.1:{port}"], connect_timeout=5.0)
    with pytest.raises(TransportError, match=f"127.0.0.1:{port}") as caught:
        async with asyncio.timeout(WAIT):
            await t.connect()
    assert isinstance(caught.value.__cause__, KafkaError)
    await t.close()


def aiokafka_lines(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.split(".")[0] == "aiokafka" and r.levelno >= level]


@pytest.fixture
def no_quiet_hold() -> None:
    """What these tests count needs no other transport to be in an outage: every transport a
    test connects must be closed or dropped (collected here), which releases its hold."""
    gc.collect()
    assert not logging.getLogger("aiokafka").filters, "a KafkaTransport is held, never closed"


@pytest.mark.usefixtures("no_quiet_hold")
async def test_an_unreachable_broker_shows_aiokafka_s_first_error_not_each_retry_s(
        caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there
    t = KafkaTransport([f"127.0.0.1:{port}"], connect_timeout=5.0)
    try:
        for _ in range(4):  # the worker's reconnects, without their backoff
            with pytest.raises(TransportError):
                async with asyncio.timeout(WAIT):
                    await t.connect()
        (line,) = aiokafka_lines(caplog)
        assert f"127.0.0.1:{port}" in line
    finally:
        await t.close()
    assert not logging.getLogger("aiokafka").filters  # taken off with the last hold
    caplog.clear()
    again = KafkaTransport([f"127.0.0.1:{port}"], connect_timeout=5.0)
    with pytest.raises(TransportError):
        async with asyncio.timeout(WAIT):
            await again.connect()
    await again.close()
    assert len(aiokafka_lines(caplog)) == 1  # a new outage shows its first error again


@pytest.mark.usefixtures("no_quiet_hold")
async def test_the_quieted_repeats_stay_at_debug_for_an_aiokafka_logger_set_to_debug(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="aiokafka")
    t = KafkaTransport([f"127.0.0.1:{free_port()}"], connect_timeout=5.0)
    try:
        for _ in range(3):
            with pytest.raises(TransportError):
                async with asyncio.timeout(WAIT):
                    await t.connect()
    finally:
        await t.close()
    assert len(aiokafka_lines(caplog)) == 1
    assert len([line for line in aiokafka_lines(caplog, logging.DEBUG)
                if line.startswith("Unable connect")]) == 3


async def test_a_transport_dropped_unclosed_releases_its_hold_when_collected() -> None:
    t = KafkaTransport(f"127.0.0.1:{free_port()}", connect_timeout=5.0)
    with pytest.raises(TransportError):
        async with asyncio.timeout(WAIT):
            await t.connect()
    assert logging.getLogger("aiokafka").filters
    del t
    gc.collect()
    assert not logging.getLogger("aiokafka").filters


@pytest.mark.usefixtures("no_quiet_hold")
async def test_a_worker_waiting_for_its_broker_logs_one_warning_and_one_aiokafka_error(
        caplog: pytest.LogCaptureFixture) -> None:
    class Counting(KafkaTransport):
        attempts = 0
        retried = asyncio.Event()

        async def connect(self) -> None:
            Counting.attempts += 1
            if Counting.attempts == 4:
                Counting.retried.set()
            await super().connect()

    app = debatebus.DebateBus(Counting(f"127.0.0.1:{free_port()}", connect_timeout=5.0),
                              heartbeat_interval_s=None)
    async def answer(payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    app.subscribe("debate:request", answer)
    worker = asyncio.create_task(app.run())
    try:
        await asyncio.wait_for(Counting.retried.wait(), WAIT)
    finally:
        app.stop()
        await asyncio.wait_for(worker, WAIT)
        await app.close()
    worker_lines = [r for r in caplog.records if r.name == "debatebus.worker"
                    and r.levelno >= logging.WARNING]
    assert len(worker_lines) == 1 and "cannot connect at start-up" in worker_lines[0].getMessage()
    assert len(aiokafka_lines(caplog)) == 1


async def test_broker_that_never_answers_fails_within_connect_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.read()  # accepts the connection, never speaks Kafka
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        t = KafkaTransport(f"127.0.0.1:{port}", connect_timeout=1.0)
        with pytest.raises(TransportError, match="timed out"):
            async with asyncio.timeout(WAIT):
                await t.publish(Outgoing("x:y", b"z"))
        await t.close()
    finally:
        server.close()
