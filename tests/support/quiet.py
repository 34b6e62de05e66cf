"""Positive signals for "expect nothing more" checks: instead of sleeping and hoping a slow machine
has finished, wait until the broker shows that nothing is left that could still produce a result.

- ``settled_redis_group``: the consumer group has been handed every entry of the stream (lag 0)
  and has acked them all (``XPENDING`` count 0), so no request can be delivered again.
- ``settled_kafka_group``: the group's committed offset equals the log end offset on every
  partition, so no request can be delivered again.
- ``settled_group``: either of them, by the URL's scheme.
- ``redis_results_read``: a collector has read every result on the event type's result streams.
- ``results_read``: a ``Collector`` has read every result (Redis), or a short fetch grace (Kafka).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from redis import asyncio as redis_asyncio

from debatebus.schemas.envelope import completed_topic, failed_topic
from debatebus.transports.kafka._names import kafka_topic
from tests.support.processes import Collector

WAIT_S = 60.0


async def _until(check: Callable[[], Awaitable[bool]], what: Callable[[], Awaitable[str]],
                 timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {await what()}")
        await asyncio.sleep(0.1)


async def settled_redis_group(url: str, stream: str, group: str, timeout: float = WAIT_S) -> None:
    """Wait until ``group`` has been delivered every entry of ``stream`` and has acked them all."""
    probe = redis_asyncio.Redis.from_url(url)

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

    try:
        await _until(settled, what, timeout)
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


async def redis_results_read(url: str, event_type: str, count: Callable[[], int],
                             timeout: float = WAIT_S) -> None:
    """Wait until ``count()`` (results a collector has read) reaches the number of entries on
    ``event_type``'s completed and failed streams: the collector has read every result there is."""
    probe = redis_asyncio.Redis.from_url(url)

    async def on_streams() -> int:
        return sum([int(await probe.xlen(completed_topic(event_type))),
                    int(await probe.xlen(failed_topic(event_type)))])

    async def read_all() -> bool:
        return count() >= await on_streams()

    async def what() -> str:
        return f"the collector to read all {await on_streams()} results (it has {count()})"

    try:
        await _until(read_all, what, timeout)
    finally:
        await probe.aclose()


async def results_read(url: str, event_type: str, collector: Collector) -> None:
    """After ``settled_group``: wait until ``collector`` has read every result the workers wrote.
    On Redis the result streams' lengths say how many there are. On Kafka, whose record counts
    Tansu's offsets do not give, a short grace covers the collector's fetch of records produced
    before the offsets it waited for were committed."""
    if url.startswith("kafka://"):
        await asyncio.sleep(1.0)  # the collector's fetch lag, not the workers' progress
    else:
        await redis_results_read(url, event_type, lambda: len(collector.results))
