"""Positive signals for "expect nothing more" checks: instead of sleeping and hoping a slow machine
has finished, wait until the broker shows that nothing is left that could still produce a result.

- ``settled_stream_group`` (any redis-py asyncio client, a cluster's too) and
  ``settled_redis_group`` (a server's URL): the consumer group has been handed every entry of the
  stream (lag 0) and has acked them all (``XPENDING`` count 0), so no request can be delivered
  again.
- ``settled_kafka_group``: the group's committed offset equals the log end offset on every
  partition, so no request can be delivered again.
- ``settled_group``: either of them, by the URL's scheme.
- ``streams_read`` and ``redis_results_read``: a collector has read every result on the result
  streams.
- ``results_read``: a ``Collector`` has read every result on the broker (Redis or Kafka).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from redis import asyncio as redis_asyncio

from debatebus.schemas.envelope import completed_topic, failed_topic
from debatebus.transports.kafka import kafka_topic
from tests.support.processes import Collector

WAIT_S = 60.0


async def _until(check: Callable[[], Awaitable[bool]], what: Callable[[], Awaitable[str]],
                 timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {await what()}")
        await asyncio.sleep(0.1)


#: A redis-py asyncio client, of one server or of a Redis Cluster.
RedisProbe = redis_asyncio.Redis | redis_asyncio.RedisCluster


async def settled_stream_group(probe: RedisProbe, stream: str, group: str,
                               timeout: float = WAIT_S) -> None:
    """Wait until ``group`` has been delivered every entry of the stream key ``stream`` (lag 0)
    and has acked them all (``XPENDING`` count 0)."""

    async def state() -> tuple[int, int | None]:
        pending = int((await probe.xpending(stream, group))["pending"])
        lag = next((g.get("lag") for g in await probe.xinfo_groups(stream)
                    if g["name"] in (group, group.encode())), None)
        return pending, None if lag is None else int(lag)

    async def settled() -> bool:
        return await state() == (0, 0)

    async def what() -> str:
        pending, lag = await state()
        return f"group {group} on {stream} to settle (pending {pending}, lag {lag})"

    await _until(settled, what, timeout)


async def settled_redis_group(url: str, stream: str, group: str, timeout: float = WAIT_S) -> None:
    """``settled_stream_group`` on the single Redis server at ``url``."""
    probe = redis_asyncio.Redis.from_url(url)
    try:
        await settled_stream_group(probe, stream, group, timeout)
    finally:
        await probe.aclose()


async def kafka_offsets(bootstrap: str, group: str, topic: str
                        ) -> tuple[dict[int, int], dict[int, int]]:
    """The group's committed offset and the log end of every partition of the Kafka ``topic``,
    read by a consumer that does not join the group (so it causes no rebalance)."""
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await reader.start()
    try:
        await reader.topics()  # loads the metadata
        tps = [TopicPartition(topic, p) for p in sorted(reader.partitions_for_topic(topic) or ())]
        ends = await reader.end_offsets(tps)
        committed = {tp.partition: await reader.committed(tp) or 0 for tp in tps}
        return committed, {tp.partition: ends[tp] for tp in tps}
    finally:
        await reader.stop()


async def settled_kafka_group(bootstrap: str, group: str, topic: str,
                              timeout: float = WAIT_S) -> None:
    """Wait until ``group`` has committed the log end of every partition of the Kafka ``topic``."""

    async def settled() -> bool:
        committed, ends = await kafka_offsets(bootstrap, group, topic)
        return bool(ends) and committed == ends

    async def what() -> str:
        committed, ends = await kafka_offsets(bootstrap, group, topic)
        return f"group {group} to commit {topic}'s log ends {ends} (committed {committed})"

    await _until(settled, what, timeout)


async def settled_group(url: str, event_type: str, group: str, timeout: float = WAIT_S) -> None:
    """``settled_kafka_group`` or ``settled_redis_group`` for ``event_type``'s requests."""
    if url.startswith("kafka://"):
        await settled_kafka_group(url.removeprefix("kafka://"), group, kafka_topic(event_type),
                                  timeout)
    else:
        await settled_redis_group(url, event_type, group, timeout)


async def streams_read(probe: RedisProbe, streams: list[str], count: Callable[[], int],
                       timeout: float = WAIT_S) -> None:
    """Wait until ``count()`` (results a collector has read) reaches the number of entries on the
    stream keys ``streams``: the collector has read every result there is."""

    async def on_streams() -> int:
        return sum([int(await probe.xlen(stream)) for stream in streams])

    async def read_all() -> bool:
        return count() >= await on_streams()

    async def what() -> str:
        return f"the collector to read all {await on_streams()} results (it has {count()})"

    await _until(read_all, what, timeout)


async def redis_results_read(url: str, event_type: str, count: Callable[[], int],
                             timeout: float = WAIT_S) -> None:
    """``streams_read`` of ``event_type``'s completed and failed streams on the server at ``url``."""
    probe = redis_asyncio.Redis.from_url(url)
    try:
        await streams_read(probe, [completed_topic(event_type), failed_topic(event_type)], count,
                           timeout)
    finally:
        await probe.aclose()


async def kafka_results(bootstrap: str, event_type: str) -> int:
    """How many result records ``event_type``'s completed and failed topics hold now: read from
    the beginning to the log end by a consumer outside any group (Tansu's offsets do not count
    records one by one, so they are read, not subtracted)."""
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        await reader.topics()  # loads the metadata
        tps = [TopicPartition(name, p) for name in map(kafka_topic, (completed_topic(event_type),
                                                                     failed_topic(event_type)))
               for p in sorted(reader.partitions_for_topic(name) or ())]
        if not tps:
            return 0
        reader.assign(tps)
        await reader.seek_to_beginning(*tps)
        ends = await reader.end_offsets(tps)
        seen = 0
        while [tp for tp in tps if await reader.position(tp) < ends[tp]]:
            batches = await reader.getmany(*tps, timeout_ms=500)
            seen += sum(len(records) for records in batches.values())
        return seen
    finally:
        await reader.stop()


async def results_read(url: str, event_type: str, collector: Collector,
                       timeout: float = WAIT_S) -> None:
    """After ``settled_group``: wait until ``collector`` has read every result the workers wrote
    (the broker's count of them, on Redis the result streams' lengths, on Kafka the records
    read back from the result topics)."""
    if not url.startswith("kafka://"):
        await redis_results_read(url, event_type, lambda: len(collector.results), timeout)
        return
    bootstrap = url.removeprefix("kafka://")
    count = await kafka_results(bootstrap, event_type)  # no more are written once settled

    async def read_all() -> bool:
        return len(collector.results) >= count

    async def what() -> str:
        return f"the collector to read all {count} results (it has {len(collector.results)})"

    await _until(read_all, what, timeout)
