"""Group-less reading for ``KafkaTransport``: the live tail behind ``subscribe()`` and the time
bounds behind ``read_range()`` (ops replay). These readers belong to no group and commit nothing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerStoppedError, TopicPartition

from debatebus.transports._base import Delivery
from debatebus.transports.kafka._errors import KAFKA_ERRORS, kafka_errors, logger, translate
from debatebus.transports.kafka._settings import POLL_MS
from debatebus.transports.kafka._wire import to_delivery


async def poll(reader: AIOKafkaConsumer, *tps: TopicPartition, servers: str) -> list[Any] | None:
    """One getmany as a flat list of records; None once the reader was stopped by close()."""
    try:
        batch = await reader.getmany(*tps, timeout_ms=POLL_MS)
    except ConsumerStoppedError:
        return None
    except KAFKA_ERRORS as exc:
        raise translate(exc, "reading", servers) from exc
    return [record for records in batch.values() for record in records]


class Subscription:
    """What ``subscribe`` returns: already positioned; ``aclose()`` (or the transport's
    ``close()``) stops its reader. A class, not a generator, so closing works before iterating."""

    def __init__(self, reader: AIOKafkaConsumer, names: dict[str, str], servers: str,
                 release: Callable[[], Awaitable[None]]) -> None:
        self._reader = reader
        self._names = names
        self._servers = servers
        # The transport's, not reader.stop(): the transport's close() must forget it too.
        self._release = release
        self._pending: deque[Delivery] = deque()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Delivery:
        while not self._pending:
            records = await poll(self._reader, servers=self._servers)
            if records is None:
                raise StopAsyncIteration
            self._pending.extend(to_delivery(r, self._names[r.topic]) for r in records)
        return self._pending.popleft()

    async def aclose(self) -> None:
        await self._release()


async def bounds(reader: AIOKafkaConsumer, tps: list[TopicPartition],
                  start: int | datetime | None, end: int | datetime | None, *,
                  servers: str, timeout: float) -> dict[TopicPartition, tuple[int, int]]:
    """Per partition, the offsets [first, stop) to scan; ``end`` is inclusive."""
    with kafka_errors("reading partition offsets", servers):
        begins = await reader.beginning_offsets(tps)
        ends = await reader.end_offsets(tps)
    if isinstance(start, datetime):
        at = int(millis(start, 0))
        firsts = await time_starts(reader, tps, at, begins, ends, servers=servers,
                                    timeout=timeout)
    else:
        firsts = {tp: max(begins[tp], start or 0) for tp in tps}
    stops = {tp: min(ends[tp], end + 1) if isinstance(end, int) else ends[tp] for tp in tps}
    return {tp: (firsts[tp], stops[tp]) for tp in tps}


async def time_starts(reader: AIOKafkaConsumer, tps: list[TopicPartition], at: int,
                       begins: dict[TopicPartition, int], ends: dict[TopicPartition, int], *,
                       servers: str, timeout: float) -> dict[TopicPartition, int]:
    """Where to start reading for records at or after ``at`` (ms), per partition.

    Uses the broker's time index (offsets_for_times) when it passes a check: Kafka answers
    the earliest offset with timestamp >= at, so the record before it must be older. Tansu's
    index ignores record timestamps (it answered offset 0 for any time, or a later offset
    than the first matching record), so a failed check falls back to the partition's
    beginning. Starting early is always safe: read_range filters by timestamp anyway.
    """
    with kafka_errors("looking up offsets by time", servers):
        found = await reader.offsets_for_times({tp: at for tp in tps})
    starts = {}
    for tp in tps:
        hit = found.get(tp)
        offset = ends[tp] if hit is None else hit.offset
        if offset > begins[tp] and not await _older_before(reader, tp, offset, at,
                                                           servers=servers, timeout=timeout):
            logger.warning("Kafka: the broker's time index answered offset %d for %s, but an "
                           "earlier record is not older; scanning %s from its beginning",
                           offset, tp, tp)
            offset = begins[tp]
        starts[tp] = offset
    return starts


async def _older_before(reader: AIOKafkaConsumer, tp: TopicPartition, offset: int, at: int, *,
                        servers: str, timeout: float) -> bool:
    """Whether the record just before ``offset`` has a timestamp before ``at``."""
    reader.seek(tp, offset - 1)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        records = await poll(reader, tp, servers=servers)
        if records:
            before = records[0]
            return bool(before.offset < offset and before.timestamp < at)
    return False


async def record_at(reader: AIOKafkaConsumer, tp: TopicPartition, offset: int, *,
                     servers: str, timeout: float) -> Any | None:
    """The record at ``offset``, where ``reader`` is positioned; None if the log has none
    there (it ends before, or the reader was stopped) within ``timeout``."""
    with kafka_errors("reading partition offsets", servers):
        if offset >= (await reader.end_offsets([tp]))[tp]:
            return None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        records = await poll(reader, tp, servers=servers)
        if records is None:
            return None
        if records:
            first = records[0]
            return first if first.offset == offset else None
    return None


def millis(moment: int | datetime | None, unbounded: float) -> float:
    """A time bound in ms since the epoch; an offset or None puts no bound on time."""
    return moment.timestamp() * 1000 if isinstance(moment, datetime) else unbounded
