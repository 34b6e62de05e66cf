"""The consumer side of the Redis Streams transport: its *seats* in consumer groups, the reads
(``XREADGROUP``, ``XAUTOCLAIM``), the keep-alive of what it holds, and trimming the streams it
reads by age (``XTRIM … MINID``, when it starts and every ``trim_every_s``). The wire format and the
rules are ``redis_streams``' (its module docstring); ``RedisStreamsTransport`` is the public face.

``StreamsLink`` is what the transport and its consumer side share: the client once connected,
where it points, the timeouts and the topic → stream key rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.asyncio import Redis

from debatebus._redis import Batcher, Command, RedisClient, by_slot, redis_call
from debatebus.exceptions import ConfigError, TransportError
from debatebus.transports._base import RECOVERED_HEADER, Delivery
from debatebus.transports._redis_entries import entry_to_delivery, stream_entries
from debatebus.transports._redis_reads import ReadTracker, SlotReads, log

T = TypeVar("T")
NOT_CONNECTED = "the Redis transport is not connected: call connect() or use async with"


@dataclass(slots=True, eq=False)
class StreamsLink:
    """The Streams transport's connection state, shared by its parts."""

    where: str  # host:port, for messages (never the URL: it may hold a password)
    timeout: float  # bounds every call; blocking reads get their block on top
    block_ms: int
    cluster: bool
    #: A topic's stream key (one rule for every command: ``debatebus._redis.stream_key_rule``).
    key: Callable[[str], str]
    client: RedisClient | None = None
    #: Every command goes through it: pipelined, or (``on``) on the client of the server that
    #: holds its key; on a cluster both route by the one slot map.
    batcher: Batcher | None = None
    closed: bool = False
    reads: ReadTracker = field(default_factory=ReadTracker)

    def batch(self) -> Batcher:
        if self.batcher is None or self.closed:
            raise TransportError(NOT_CONNECTED)
        return self.batcher

    def call(self, blocking_ms: int = 0) -> contextlib.AbstractAsyncContextManager[None]:
        return redis_call(self.where, self.timeout + blocking_ms / 1000)

    async def on(self, key: str, call: Callable[[Redis], Awaitable[T]], blocking_ms: int = 0) -> T:
        """``call`` on the client of the server (a cluster's master) holding ``key``: what the
        batcher's pipelines cannot carry (blocking reads, redis-py's reply parsing); bounded by
        the timeout (and ``blocking_ms``), its errors mapped."""
        async with self.call(blocking_ms):
            return await self.batch().on_master(key, call)


@dataclass(slots=True, eq=False)
class Seat:
    """This consumer's seat in one stream's group: the entries it holds unsettled, kept alive
    (a *claim* on them, in Redis's words; not a debate's lease, which the checkpoint store keeps)."""

    topic: str
    key: str  # the stream: the topic itself, or its cluster key
    group: str
    consumer: str
    inflight: set[str] = field(default_factory=set)
    #: A requeued entry is waiting in the pending list: reclaim without waiting for the timer.
    claim_due: bool = False


def seat_of(delivery: Delivery) -> Seat:
    """The seat ``delivery`` was read through; a ``ConfigError`` if it came from no group."""
    if not isinstance(delivery.token, Seat):
        raise ConfigError("ack and reject take deliveries from consume(), not from subscribe() "
                          "or read_range()")
    return delivery.token


def _key_of(seat: Seat) -> str:
    return seat.key


def _room(seats: list[Seat], prefetch: int) -> int:
    """How many entries one read may take: what ``prefetch`` leaves beside those this consumer
    holds, and at least one, since it is asked only for a delivery a free slot will run (a slot
    a waiting handler lent out is free too). Redis counts every read as a delivery, so entries
    read ahead of any slot to run them would each count one more, for nothing, when the worker
    holding them dies."""
    return max(1, prefetch - sum(len(seat.inflight) for seat in seats))


class ConsumerGroups:
    """Consuming through consumer groups: seats outlive ``consume`` calls (consuming again after
    an error carries on with what is held), and ``start``/``stop`` run the keep-alive."""

    def __init__(self, link: StreamsLink, *, claim_idle_ms: int,
                 submit: Callable[[Sequence[Command]], Awaitable[list[Any]]],
                 trim: Callable[[], tuple[Any, ...]], trim_every_s: float) -> None:
        self._link = link
        self._claim_idle_ms = claim_idle_ms
        self._submit = submit  # pipelined with the transport's other commands of the tick
        self._trim = trim  # XTRIM's arguments now (the transport's retention); () for none
        self._trim_every_s = trim_every_s
        self._seats: dict[tuple[str, str, str], Seat] = {}
        self._keepalive: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._keepalive = asyncio.create_task(self._keep_claims(), name="debatebus-redis-keepalive")

    async def stop(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
            self._keepalive = None

    def release(self, delivery: Delivery) -> None:
        if isinstance(delivery.token, Seat):
            delivery.token.inflight.discard(delivery.id)

    async def requeue(self, delivery: Delivery) -> None:
        seat = seat_of(delivery)
        seat.inflight.discard(delivery.id)
        # Back-dating the entry's idle time makes the next XAUTOCLAIM (ours, or any live
        # consumer's) take it, which also counts the delivery; JUSTID leaves the count alone here.
        # Should this fail, the entry is still released: it is claimed after claim_idle_ms.
        await self._submit([("XCLAIM", seat.key, seat.group, seat.consumer, 0, delivery.id,
                             "IDLE", self._claim_idle_ms, "JUSTID")])
        seat.claim_due = True

    def _seat(self, topic: str, group: str, consumer: str) -> Seat:
        key = (topic, group, consumer)
        seat = self._seats.get(key)
        if seat is None:
            seat = self._seats[key] = Seat(topic, self._link.key(topic), group, consumer)
        return seat

    async def _ensure_groups(self, seats: Iterable[Seat]) -> None:
        for seat in seats:
            try:
                await self._link.on(seat.key, functools.partial(_create_group, seat))
            except TransportError as e:
                if "BUSYGROUP" not in str(e.__cause__):
                    raise

    async def consume(self, topics: Sequence[str], *, group: str, consumer: str,
                      prefetch: int) -> AsyncGenerator[Delivery, None]:
        seats = [self._seat(topic, group, consumer) for topic in topics]
        await self._ensure_groups(seats)
        slots = by_slot(seats, _key_of) if self._link.cluster else [seats]
        # Several slots: a blocking read per slot, kept running across rounds until it answers.
        several = (SlotReads([functools.partial(self._read_new, part, prefetch) for part in slots])
                   if len(slots) > 1 else None)
        batch: list[Delivery] = []
        next_claim = next_trim = 0.0
        try:
            while not self._link.closed:
                try:
                    if next_trim <= time.monotonic():
                        next_trim = time.monotonic() + self._trim_every_s
                        await self._trim_streams(seats)
                    if next_claim <= time.monotonic() or any(seat.claim_due for seat in seats):
                        next_claim = time.monotonic() + self._claim_idle_ms / 2000
                        batch = await self._reclaim(seats, _room(seats, prefetch))
                    if not batch:
                        batch = await (several.next() if several is not None
                                       else self._read_new(seats, _room(seats, prefetch)))
                except TransportError as e:
                    gone = "NOGROUP" in str(e.__cause__)
                    if not gone and "UNBLOCKED" not in str(e.__cause__):
                        raise
                    # The stream or group is gone (deleted, or Redis restarted without its
                    # data), or moved to another cluster master under a blocked read: make them
                    # again where they are now and carry on.
                    if gone:
                        log.warning(
                            "the stream or consumer group of %s (group %s) was gone from Redis "
                            "(did it restart without its data, or was the key deleted?): made "
                            "again. Requests read before are lost to the broker; those this "
                            "worker is running are still answered, marked %s",
                            ", ".join(seat.topic for seat in seats), seats[0].group,
                            RECOVERED_HEADER)
                    await self._ensure_groups(seats)
                    continue
                batch.reverse()
                while batch:
                    yield batch.pop()
        except TransportError:
            if not self._link.closed:  # close() pulls the connection from under a blocked read
                raise
        finally:
            if several is not None:  # reads still running are cancelled: what they read stays
                batch += several.stop()  # pending, as does what finished reads got
            # Read but never handed out: left pending, reclaimed after claim_idle_ms.
            for delivery in batch:
                delivery.token.inflight.discard(delivery.id)

    async def _trim_streams(self, seats: list[Seat]) -> None:
        """Trim the streams read by age, as every ``XADD`` of debatebus does: requests from
        producers that add without trimming age out too."""
        trim = self._trim()
        if trim:
            await self._submit([("XTRIM", seat.key, *trim) for seat in seats])

    async def _read_new(self, seats: list[Seat], prefetch: int) -> list[Delivery]:
        streams = {seat.key: ">" for seat in seats}
        seat = seats[0]

        async def read(redis: Redis) -> Any:
            return await redis.xreadgroup(seat.group, seat.consumer, streams,  # type: ignore[arg-type]
                                          count=prefetch, block=self._link.block_ms)

        with self._link.reads.reading():
            reply = await self._link.on(seat.key, read, self._link.block_ms)
        return self._deliveries(seats, reply)

    def _deliveries(self, seats: list[Seat], reply: Any) -> list[Delivery]:
        by_name = {seat.key.encode(): seat for seat in seats} if len(seats) > 1 else None
        out: list[Delivery] = []
        for name, entries in stream_entries(reply):
            seat = by_name[name] if by_name is not None else seats[0]
            inflight, topic = seat.inflight, seat.topic
            for entry_id, fields in entries:
                if fields is None:  # trimmed away while pending
                    continue
                delivery = entry_to_delivery(topic, entry_id, fields, 1, seat)
                inflight.add(delivery.id)
                out.append(delivery)
        return out

    async def _reclaim(self, seats: list[Seat], prefetch: int) -> list[Delivery]:
        out: list[Delivery] = []
        for seat in seats:
            seat.claim_due = False
            claimed = await self._autoclaim(seat, prefetch - len(out))
            if claimed:
                counts = await self._delivery_counts(seat, [ident for ident, _ in claimed])
                out += (entry_to_delivery(seat.topic, ident, fields, counts.get(ident, 2), seat)
                        for ident, fields in claimed)
            if len(out) >= prefetch:
                break
        # Held only once the whole batch is in hand: a failure half-way leaves nothing held that
        # is never handed out (what was claimed is claimed again after claim_idle_ms).
        for delivery in out:
            delivery.token.inflight.add(delivery.id)
        return out

    async def _autoclaim(self, seat: Seat, limit: int) -> list[tuple[str, Any]]:
        """Entries idle past ``claim_idle_ms`` in any consumer's pending list, now ours.

        Claimed by id first (``JUSTID``, which counts no delivery), so this consumer's own
        entries still being worked on (its loop stalled past a keep-alive: the claim refreshes
        them) are passed over without a delivery counted that never happened; the others are
        then claimed with their fields, which counts their redelivery."""
        claimed: list[tuple[str, Any]] = []
        cursor: Any = "0-0"
        while len(claimed) < limit:
            [reply] = await self._submit([(
                "XAUTOCLAIM", seat.key, seat.group, seat.consumer, self._claim_idle_ms, cursor,
                "COUNT", limit - len(claimed), "JUSTID")])
            cursor = reply[0]
            fresh: list[Any] = [i for i in map(_text, reply[1]) if i not in seat.inflight]
            if fresh:
                entries = await self._link.on(seat.key, functools.partial(_claim, seat, fresh))
                claimed += ((_text(entry_id), fields) for entry_id, fields in entries
                            if entry_id is not None and fields is not None)  # not deleted
            if cursor in (b"0-0", "0-0"):
                break
        return claimed

    async def _delivery_counts(self, seat: Seat, ids: list[str]) -> dict[str, int]:
        """XAUTOCLAIM does not report delivery counts; XPENDING does, one id at a time."""

        async def pending(redis: Redis) -> list[Any]:
            pipe = redis.pipeline(transaction=False)
            for ident in ids:
                pipe.xpending_range(seat.key, seat.group, ident, ident, 1, seat.consumer)
            return await pipe.execute()

        replies = await self._link.on(seat.key, pending)
        counts: dict[str, int] = {}
        for ident, reply in zip(ids, replies, strict=True):
            if reply:
                counts[ident] = int(reply[0]["times_delivered"])
        return counts

    async def _refresh(self, held: Mapping[Seat, Iterable[str]]) -> None:
        """XCLAIM … JUSTID resets the idle time without counting a delivery: one pipeline per
        hash slot (on a cluster, each to its master)."""
        seats = list(held)
        for part in by_slot(seats, _key_of) if self._link.cluster else [seats]:
            await self._link.on(part[0].key, functools.partial(_keep, {s: held[s] for s in part}))

    async def _keep_claims(self) -> None:
        """Keep everything this process holds — handed out or still buffered — from looking
        abandoned, so no live consumer's work is taken over however long a debate runs. Lives
        through outages: one warning when refreshing starts failing, one INFO when it works again."""
        failing = False
        while True:
            await asyncio.sleep(self._claim_idle_ms / 3000)
            if self._link.closed:  # close() cancels us once the reads are done
                return
            held = {seat: seat.inflight for seat in self._seats.values() if seat.inflight}
            if not held:
                continue
            try:
                await self._refresh(held)
            except Exception as e:  # whatever it is, the next round may get through
                if not failing:
                    log.warning("cannot keep held entries alive: they may be reclaimed by another "
                                "consumer if this lasts over claim_idle_ms; retrying every %.1f s: "
                                "%s", self._claim_idle_ms / 3000, e)
                failing = True
                continue
            if failing:
                log.info("Redis at %s answers again: held entries are kept alive again",
                         self._link.where)
            failing = False


async def _create_group(seat: Seat, redis: Redis) -> Any:
    return await redis.xgroup_create(seat.key, seat.group, id="0", mkstream=True)


async def _claim(seat: Seat, ids: list[Any], redis: Redis) -> Any:
    return await redis.xclaim(seat.key, seat.group, seat.consumer, 0, ids)


async def _keep(held: Mapping[Seat, Iterable[str]], redis: Redis) -> None:
    pipe = redis.pipeline(transaction=False)
    for seat, ids in held.items():
        pipe.xclaim(seat.key, seat.group, seat.consumer, 0, list(ids), justid=True)
    await pipe.execute(raise_on_error=False)


def _text(entry_id: bytes | str) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id
