"""Partitioned Kafka: worker processes splitting a 3-partition request topic, and a rebalance
during load (a worker joins, another leaves by SIGTERM or SIGKILL) with the checkpoint store.

Counted from outside: results by requestId (from the result topics), model calls per debate (the
worker app's calls log), and the group's committed offsets against the log ends.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from tests.support.processes import (
    Collector,
    WorkerProcess,
    assert_store_answers,
    collecting,
    committed_round_reruns,
    env_for,
    read_calls,
)
from tests.support.quiet import kafka_offsets, results_read, settled_kafka_group
from tests.support.servers import RedisServer, TansuServer
from tests.support.transports import GROUP_OPTIONS, WAIT, Reader, committed

from debatebus.client import BusClient
from debatebus.exceptions import ConfigError
from debatebus.transports import transport_from_url
from debatebus.transports._base import Outgoing
from debatebus.transports.kafka import KafkaTransport, kafka_topic

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

PARTITIONS = 3
# A bound on the flow, should the group never change: at 6 a second, beyond the waits before
# the group has changed (211 s at most), however slow the machine.
MAX_REQUESTS = 2000
#: The worker app's debate with 2 rounds and a judge: framing, 2 × (2 turns + verdict), synthesis.
NEEDED = 8


def test_partitions_from_the_broker_url() -> None:
    transport = transport_from_url("kafka://h1:9092,h2:9093?partitions=6&replication_factor=2")
    assert isinstance(transport, KafkaTransport)
    settings = transport.settings
    assert (settings.servers, settings.partitions, settings.replication_factor) == \
        ("h1:9092,h2:9093", 6, 2)
    assert transport_from_url("kafka://h1:9092").settings.partitions == 3  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="partitions"):
        transport_from_url("kafka://h1:9092?partition=6")
    with pytest.raises(ConfigError, match="whole number"):
        transport_from_url("kafka://h1:9092?partitions=many")


async def test_topics_are_created_with_the_configured_partitions(tansu_server: TansuServer) -> None:
    event_type = f"debate:six{uuid.uuid4().hex[:6]}"
    async with transport_from_url(f"{tansu_server.url}?partitions=6") as transport:
        await transport.ensure_topics([event_type])
    reader = AIOKafkaConsumer(bootstrap_servers=tansu_server.bootstrap)
    await reader.start()
    try:
        await reader.topics()  # fetches the cluster's metadata
        assert reader.partitions_for_topic(kafka_topic(event_type)) == set(range(6))
    finally:
        await reader.stop()


async def test_concurrent_acks_share_one_offset_commit(tansu_server: TansuServer) -> None:
    """Acks settle at once and share the next commit: 40 acks in one tick cost one commit
    request, and each returns with its offset committed."""
    topic, group = f"debate:share{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:8]}"
    async with KafkaTransport(tansu_server.bootstrap, partitions=1, **GROUP_OPTIONS) as t:
        await t.ensure_topics([topic])
        for i in range(40):
            await t.publish(Outgoing(topic, f"m{i}".encode(), key=f"r{i}"))
        reader = Reader(t.consume([topic], group=group, consumer="c1", prefetch=40))
        deliveries = [await reader.next(WAIT) for _ in range(40)]
        (member,) = t._members  # the group member behind the iterator
        real, commits = member.consumer.commit, []

        async def counting(offsets: dict[TopicPartition, int]) -> None:
            commits.append(offsets)
            await real(offsets)

        member.consumer.commit = counting
        await asyncio.gather(*(t.ack(d) for d in deliveries))
        assert len(commits) == 1, commits
        assert await committed(tansu_server, group, topic) == 40
        reader.stop()


async def test_an_ack_waits_for_no_timer(tansu_server: TansuServer) -> None:
    """An ack's commit starts at once, not ``linger_ms`` after it (which only batches produced
    records): with a 30 s linger, an ack without results returns, committed, well before."""
    topic, group = f"debate:now{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:8]}"
    async with KafkaTransport(tansu_server.bootstrap, partitions=1, **GROUP_OPTIONS) as t:
        await t.ensure_topics([topic])
        await t.publish(Outgoing(topic, b"m", key="r"))
    options = {**GROUP_OPTIONS, "linger_ms": 30_000}
    async with KafkaTransport(tansu_server.bootstrap, partitions=1, **options) as t:
        reader = Reader(t.consume([topic], group=group, consumer="c1"))
        delivery = await reader.next(WAIT)
        started = time.monotonic()
        await t.ack(delivery)
        assert time.monotonic() - started < 15.0  # half the linger: room for a loaded machine
        assert await committed(tansu_server, group, topic) == 1
        reader.stop()


@pytest.fixture
def workers() -> Iterator[dict[str, WorkerProcess]]:
    started: dict[str, WorkerProcess] = {}
    yield started
    for w in started.values():
        w.stop()


async def _flow(client: BusClient, event_type: str, ids: list[str], per_s: float,
                until: asyncio.Event) -> None:
    """Publish ``per_s`` requests a second until ``until`` is set, recording their ids."""
    while not until.is_set() and len(ids) < MAX_REQUESTS:
        rid = f"{event_type}-{len(ids)}"
        await client.publish(event_type, {"input": f"rebalance {rid}"}, request_id=rid)
        ids.append(rid)
        await asyncio.sleep(1 / per_s)


def _pids_calling(calls: Path, since: int = 0) -> set[int]:
    return {int(c["pid"]) for c in read_calls(calls)[since:]}


async def _until(check: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {timeout}s")
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("leave", ["sigterm", "sigkill"])
async def test_rebalance_during_load_loses_nothing_and_repeats_nothing(
        leave: str, tansu_server: TansuServer, redis_server: RedisServer, tmp_path: Path,
        workers: dict[str, WorkerProcess]) -> None:
    event_type = f"debate:part{uuid.uuid4().hex[:6]}"
    calls = tmp_path / "calls.log"
    env = env_for(tansu_server.url, event_type, tmp_path, DBB_DELAY="0.05", DBB_ROUNDS=2,
                  DBB_CONCURRENCY=4, DBB_STORE=redis_server.url, DBB_LEASE_TTL="1.5")
    ids: list[str] = []
    stop = asyncio.Event()
    async with collecting(tansu_server.url, event_type) as (client, collector):
        await client.transport.ensure_topics([event_type])
        workers["a"] = WorkerProcess(env, tmp_path / "a.log")
        workers["b"] = WorkerProcess(env, tmp_path / "b.log")
        flow = asyncio.create_task(_flow(client, event_type, ids, 6.0, stop))
        # Both first workers are taking requests before the group changes.
        await _until(lambda: {workers["a"].pid, workers["b"].pid} <= _pids_calling(calls),
                     "both first workers answering", 60)
        workers["c"] = WorkerProcess(env, tmp_path / "c.log")  # joins: partitions move
        await _until(lambda: workers["c"].pid in _pids_calling(calls), "the new worker answering",
                     60)
        seen = len(read_calls(calls))
        await _until(lambda: workers["b"].pid in _pids_calling(calls, seen),
                     "the leaving worker busy after the join", 30)
        if leave == "sigterm":
            assert await asyncio.to_thread(workers["b"].terminate, 60) == 0, \
                workers["b"].log_tail()
        else:
            workers["b"].kill()
        await asyncio.sleep(1.0)  # requests keep coming while the group settles again
        assert not flow.done(), "the flow ended before the group changed: nothing was tested"
        stop.set()
        await flow
        await collector.wait_for(ids, 120)
        # Every request committed: none can be delivered again, and a duplicate's result was
        # produced before its offset was committed; then the collector has read them all.
        await settled_kafka_group(tansu_server.bootstrap, env["DBB_GROUP"],
                                  kafka_topic(event_type), 30)
        await results_read(tansu_server.url, event_type, collector)
    _, ends = await kafka_offsets(tansu_server.bootstrap, env["DBB_GROUP"], kafka_topic(event_type))
    assert all(ends.get(p, 0) > 0 for p in range(PARTITIONS)), f"not every partition was used: {ends}"
    _assert_answers(collector, ids, exactly_once=leave == "sigterm")
    _assert_calls(calls, ids, killed=leave == "sigkill")
    pids = _pids_calling(calls)
    assert {w.pid for w in workers.values()} <= pids, "every worker should have taken part"


def _assert_answers(collector: Collector, ids: list[str], *, exactly_once: bool) -> None:
    counts = collector.counts()
    assert all(counts[i] >= 1 for i in ids), f"unanswered: {[i for i in ids if not counts[i]]}"
    if exactly_once:
        assert all(counts[i] == 1 for i in ids), \
            f"answered more than once: { {i: n for i, n in counts.items() if n != 1} }"
        return
    assert_store_answers(collector.results, ids)


def _assert_calls(calls: Path, ids: list[str], *, killed: bool) -> None:
    per_debate = Counter(c["question"] for c in read_calls(calls))
    questions = {f"Debate topic: rebalance {i}" for i in ids}
    assert set(per_debate) == questions
    if killed:  # the killed worker's debates may repeat the one round they were in
        assert committed_round_reruns(calls, interruptions=1) == {}
        assert all(per_debate[q] >= NEEDED for q in questions), per_debate
    else:
        assert all(per_debate[q] == NEEDED for q in questions), \
            {q: n for q, n in per_debate.items() if n != NEEDED}
