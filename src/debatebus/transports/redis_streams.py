"""Redis Streams transport: the default for ``redis://`` and ``rediss://``.

Wire format (what any client in any language reads and writes):

* a message is an entry ``XADD``-ed to the stream named by its event type, with the field
  ``envelope`` holding the body bytes, plus ``key`` and ``headers`` (a JSON object of strings)
  only when the message has them;
* workers read through a consumer group (``XREADGROUP``, created on first consume from id ``0``
  so entries published before the group existed are delivered too);
* ``ack`` publishes the results and ``XACK``-s the request in one Lua script that first checks
  that the entry is still pending in the group (under any consumer): a result is never published
  without the acknowledgement, nor the reverse, and never twice — an ack retried after a lost
  reply, or a second consumer's ack of an entry it reclaimed, publishes nothing. A dead letter
  (``reject``) is written and acknowledged by the same script, under the same check;
* an entry idle past ``claim_idle_ms`` in the pending list of a consumer that died is taken over
  by a live one (``XAUTOCLAIM``), with its real delivery count. Live consumers refresh the idle
  time of what they hold every ``claim_idle_ms / 3``, so a debate that runs for minutes is never
  taken over while its worker is alive;
* a dead letter is an entry of ``{type}:dlq`` with the fields ``envelope`` (the original bytes,
  untouched), ``key``/``headers`` when the original had them, ``reason``, ``origin`` (the stream),
  ``originId`` and ``deliveries``. Reading it back maps those four into the headers
  ``x-debatebus-reason``, ``x-debatebus-origin``, ``x-debatebus-origin-id`` and
  ``x-debatebus-deliveries``.

Throughput: acks, rejects and publishes issued in the same event-loop tick share one pipeline
(``CommandBatcher``, one ``EVALSHA`` per ack), and each ``XREADGROUP`` fetches ``prefetch``
entries at once.

Outages: every call is bounded by ``command_timeout`` (blocking reads by ``block_ms`` more) and
fails with ``TransportError``; ``consume`` may be called again after one and carries on with the
same held entries, making the stream and group again if the server lost them. What this process
holds stays pending in Redis through an outage (the keep-alive resumes once Redis answers).

RESP2 and RESP3 (``?protocol=3``) clients both work: replies are read in either shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from debatebus.exceptions import ConfigError, TransportError
from debatebus.transports.base import (
    HEARTBEAT_STREAM_MAXLEN,
    HEARTBEAT_TOPIC,
    ORIGIN_HEADER,
    REASON_HEADER,
    Delivery,
    Outgoing,
    Transport,
    dlq_topic,
)
from debatebus.transports.redis_common import (
    ReadTracker,
    build_client,
    check_client,
    describe,
    log,
    redis_call,
)
from debatebus.transports.redis_entries import (
    DELIVERIES_HEADER,
    ENVELOPE,
    ORIGIN_ID_HEADER,
    SETTLE,
    SETTLE_SHA,
    entry_to_delivery,
    message_fields,
    stream_entries,
)
from debatebus.transports.redis_pipeline import CommandBatcher

__all__ = [
    "DELIVERIES_HEADER",
    "ORIGIN_HEADER",
    "ORIGIN_ID_HEADER",
    "REASON_HEADER",
    "RedisStreamsTransport",
    "entry_to_delivery",
]

_RANGE_PAGE = 500

@dataclass(slots=True, eq=False)
class _Seat:
    """This consumer's seat in one stream's group: the entries it holds unsettled, kept alive
    (a *claim* on them, in Redis's words; not a debate's lease, which the checkpoint store keeps)."""

    topic: str
    group: str
    consumer: str
    inflight: set[str] = field(default_factory=set)
    #: A requeued entry is waiting in the pending list: reclaim without waiting for the timer.
    claim_due: bool = False


class RedisStreamsTransport(Transport):
    """Redis Streams with consumer groups; see the module docstring for the wire format.

    ``client``: an existing ``redis.asyncio.Redis`` (built with ``decode_responses=False``) to
    use instead of building one from ``url``; it is left open by ``close``, and keeps its own
    ``socket_timeout`` (redis-py's default is 5 s: keep ``block_ms`` below it).
    ``command_timeout`` bounds every call but the blocking reads, which get ``block_ms`` more.
    """

    def __init__(self, url: str = "redis://localhost:6379/0", *, claim_idle_ms: int = 30_000,
                 block_ms: int = 1_000, max_len: int | None = None, connect_timeout: float = 5.0,
                 command_timeout: float = 10.0, client: Redis | None = None) -> None:
        if claim_idle_ms < 10 or block_ms < 1:
            raise ConfigError("claim_idle_ms must be >= 10 and block_ms >= 1")
        if client is not None:
            check_client(client)
        self._url = url
        self._connect_timeout = connect_timeout
        self._timeout = command_timeout
        self._claim_idle_ms = claim_idle_ms
        self._block_ms = block_ms
        self._trim: tuple[Any, ...] = ("MAXLEN", "~", max_len) if max_len else ()
        self._max_len: int | str = max_len or ""  # the settle script's form: '' for none
        self._client = client
        self._owns_client = client is None
        self._where = describe(url, client)
        self._batcher: CommandBatcher | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._seats: dict[tuple[str, str, str], _Seat] = {}
        self._reads = ReadTracker()
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------

    async def connect(self) -> None:
        if self._batcher is not None:
            return
        if self._client is None:
            self._client = build_client(self._url, connect_timeout=self._connect_timeout)
        async with self._call():
            await self._client.ping()
        self._closed = False
        self._batcher = CommandBatcher(self._client, self._where, timeout=self._timeout)
        self._batcher.start()
        self._keepalive = asyncio.create_task(self._keep_claims(), name="debatebus-redis-keepalive")

    async def close(self) -> None:
        self._closed = True
        await self._reads.wait_idle(self._block_ms / 1000 + 1.0)
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
            self._keepalive = None
        if self._batcher is not None:
            batcher, self._batcher = self._batcher, None
            await batcher.stop()
        if self._client is not None and self._owns_client:
            client, self._client = self._client, None
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await client.aclose()

    def _call(self, blocking_ms: int = 0) -> contextlib.AbstractAsyncContextManager[None]:
        return redis_call(self._where, self._timeout + blocking_ms / 1000)

    def _redis(self) -> Redis:
        if self._client is None or self._closed:
            raise TransportError("the Redis transport is not connected: call connect() or use async with")
        return self._client

    def _submit_to(self) -> CommandBatcher:
        if self._batcher is None:
            raise TransportError("the Redis transport is not connected: call connect() or use async with")
        return self._batcher

    # -- publishing and settling -----------------------------------------------------------------

    def _xadd(self, topic: str, fields: list[Any]) -> tuple[Any, ...]:
        return ("XADD", topic, *self._trim, "*", *fields)

    async def publish(self, message: Outgoing) -> str:
        command = self._xadd(message.topic, message_fields(message.body, message.key, message.headers))
        (entry_id,) = await self._submit_to().submit((command,))
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    async def ack(self, delivery: Delivery, results: Sequence[Outgoing] = ()) -> None:
        """Publish ``results`` and acknowledge, atomically, if the entry is still pending in the
        group; if it is not (settled already, e.g. by this same ack whose reply was lost),
        publish nothing. Idempotent: safe to retry after a ``TransportError``. Until it succeeds
        the entry stays held (kept alive): retry it, or ``release`` it."""
        await self._settle(delivery, [(r.topic, self._max_len,
                                       message_fields(r.body, r.key, r.headers)) for r in results])

    async def reject(self, delivery: Delivery, reason: str, *, requeue: bool = False) -> None:
        """``requeue``: let go of the entry now, so the next ``XAUTOCLAIM`` (this consumer's or
        another's) hands it out again, counted. Otherwise write the dead letter and acknowledge,
        as ``ack`` does (same pending check, same retry rules)."""
        if not requeue:
            await self._settle(delivery, [(dlq_topic(delivery.topic), "",  # never trimmed
                                           self._dead_letter_fields(delivery, reason))])
            return
        seat = _seat_of(delivery)
        seat.inflight.discard(delivery.id)
        # Back-dating the entry's idle time makes the next XAUTOCLAIM (ours, or any live
        # consumer's) take it, which also counts the delivery; JUSTID leaves the count alone here.
        # Should this fail, the entry is still released: it is claimed after claim_idle_ms.
        async with self._call():
            await self._redis().xclaim(seat.topic, seat.group, seat.consumer, 0, [delivery.id],
                                       idle=self._claim_idle_ms, justid=True)
        seat.claim_due = True

    def release(self, delivery: Delivery) -> None:
        """Stop keeping the entry alive: it stays pending and any consumer's ``XAUTOCLAIM``
        takes it once it has been idle for ``claim_idle_ms``."""
        if isinstance(delivery.token, _Seat):
            delivery.token.inflight.discard(delivery.id)

    async def _settle(self, delivery: Delivery, outputs: Sequence[tuple[str, int | str, list[Any]]],
                      ) -> None:
        """Run the settle script: ``outputs`` are (stream, MAXLEN or '', fields) to publish."""
        seat = _seat_of(delivery)
        keys = [seat.topic, *(topic for topic, _, _ in outputs)]
        args: list[Any] = [seat.group, delivery.id]
        for _, max_len, fields in outputs:
            args += (max_len, len(fields), *fields)
        command = ("EVALSHA", SETTLE_SHA, len(keys), *keys, *args)
        try:
            (settled,) = await self._submit_to().submit((command,))
        except TransportError as e:
            if not isinstance(e.__cause__, NoScriptError):
                raise
            async with self._call():  # a restarted Redis forgot the script: load it, once
                await self._redis().script_load(SETTLE)
            (settled,) = await self._submit_to().submit((command,))
        seat.inflight.discard(delivery.id)
        if not settled:
            log.debug("%s %s was settled already: nothing published", seat.topic, delivery.id)

    def _dead_letter_fields(self, delivery: Delivery, reason: str) -> list[Any]:
        return [*message_fields(delivery.body, delivery.key, delivery.headers),
                b"reason", reason, b"origin", delivery.topic, b"originId", delivery.id,
                b"deliveries", delivery.deliveries]

    async def dead_letter(self, delivery: Delivery, reason: str) -> str:
        """Write ``delivery`` to ``{topic}:dlq`` without acknowledging anything: for messages that
        did not come from a consumer group (Redis pub/sub keeps its dead letters here)."""
        command = ("XADD", dlq_topic(delivery.topic), "*",  # never trimmed
                   *self._dead_letter_fields(delivery, reason))
        (entry_id,) = await self._submit_to().submit([command])
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    # -- consuming -------------------------------------------------------------------------------

    def _seat(self, topic: str, group: str, consumer: str) -> _Seat:
        key = (topic, group, consumer)
        seat = self._seats.get(key)
        if seat is None:
            seat = self._seats[key] = _Seat(topic, group, consumer)
        return seat

    async def _ensure_groups(self, seats: Iterable[_Seat]) -> None:
        for seat in seats:
            try:
                async with self._call():
                    await self._redis().xgroup_create(seat.topic, seat.group, id="0",
                                                      mkstream=True)
            except TransportError as e:
                if "BUSYGROUP" not in str(e.__cause__):
                    raise

    async def ensure_topics(self, topics: Sequence[str]) -> None:
        """Streams and groups are made on first consume; nothing has to exist beforehand."""

    async def consume(self, topics: Sequence[str], *, group: str, consumer: str,
                      prefetch: int = 16) -> AsyncIterator[Delivery]:
        if prefetch < 1 or not topics:
            raise ConfigError("consume needs at least one topic and prefetch >= 1")
        await self.connect()
        # Leases outlive this call: consuming again after an error carries on with what is held.
        seats = [self._seat(topic, group, consumer) for topic in topics]
        await self._ensure_groups(seats)
        batch: list[Delivery] = []
        next_claim = 0.0
        try:
            while not self._closed:
                try:
                    if next_claim <= time.monotonic() or any(seat.claim_due for seat in seats):
                        next_claim = time.monotonic() + self._claim_idle_ms / 2000
                        batch = await self._reclaim(seats, prefetch)
                    if not batch:
                        batch = await self._read_new(seats, prefetch)
                except TransportError as e:
                    if "NOGROUP" not in str(e.__cause__):
                        raise
                    # The stream or group is gone (deleted, or Redis restarted without its
                    # data): make them again and carry on.
                    await self._ensure_groups(seats)
                    continue
                batch.reverse()
                while batch:
                    yield batch.pop()
        except TransportError:
            if not self._closed:  # close() pulls the connection from under a blocked read
                raise
        finally:
            # Read but never handed out: left pending, reclaimed after claim_idle_ms.
            for delivery in batch:
                delivery.token.inflight.discard(delivery.id)

    async def _read_new(self, seats: list[_Seat], prefetch: int) -> list[Delivery]:
        streams = {seat.topic: ">" for seat in seats}
        seat = seats[0]
        with self._reads.reading():
            async with self._call(self._block_ms):
                reply = await self._redis().xreadgroup(
                    seat.group, seat.consumer, streams,  # type: ignore[arg-type]
                    count=prefetch, block=self._block_ms)
        return self._deliveries(seats, reply)

    def _deliveries(self, seats: list[_Seat], reply: Any) -> list[Delivery]:
        by_name = {seat.topic.encode(): seat for seat in seats} if len(seats) > 1 else None
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

    async def _reclaim(self, seats: list[_Seat], prefetch: int) -> list[Delivery]:
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

    async def _autoclaim(self, seat: _Seat, limit: int) -> list[tuple[str, Any]]:
        """Entries idle past ``claim_idle_ms`` in any consumer's pending list, now ours."""
        claimed: list[tuple[str, Any]] = []
        cursor: Any = "0-0"
        while len(claimed) < limit:
            async with self._call():
                reply: Any = await self._redis().xautoclaim(
                    seat.topic, seat.group, seat.consumer, self._claim_idle_ms,
                    start_id=cursor, count=limit - len(claimed))
            cursor = reply[0]
            for entry_id, fields in reply[1]:
                if entry_id is None or fields is None:  # deleted entries (Redis 6.2 shape)
                    continue
                ident = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                # Ours and still being worked on (the loop stalled past a keepalive): skip it.
                if ident not in seat.inflight:
                    claimed.append((ident, fields))
            if cursor in (b"0-0", "0-0"):
                break
        return claimed

    async def _delivery_counts(self, seat: _Seat, ids: list[str]) -> dict[str, int]:
        """XAUTOCLAIM does not report delivery counts; XPENDING does, one id at a time."""
        pipe = self._redis().pipeline(transaction=False)
        for ident in ids:
            pipe.xpending_range(seat.topic, seat.group, ident, ident, 1, seat.consumer)
        async with self._call():
            replies: list[Any] = await pipe.execute()
        counts: dict[str, int] = {}
        for ident, reply in zip(ids, replies, strict=True):
            if reply:
                counts[ident] = int(reply[0]["times_delivered"])
        return counts

    async def _refresh(self, held: Mapping[_Seat, Iterable[str]]) -> None:
        # XCLAIM … JUSTID resets the idle time without counting a delivery.
        pipe = self._redis().pipeline(transaction=False)
        for seat, ids in held.items():
            pipe.xclaim(seat.topic, seat.group, seat.consumer, 0, list(ids), justid=True)
        await pipe.execute(raise_on_error=False)

    async def _keep_claims(self) -> None:
        """Keep everything this process holds — handed out or still buffered — from looking
        abandoned, so no live consumer's work is taken over however long a debate runs. Lives
        through outages: one warning when refreshing starts failing, one INFO when it works again."""
        failing = False
        while True:
            await asyncio.sleep(self._claim_idle_ms / 3000)
            if self._closed:  # close() cancels us once the reads are done
                return
            held = {seat: seat.inflight for seat in self._seats.values() if seat.inflight}
            if not held:
                continue
            try:
                async with self._call():
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
                         self._where)
            failing = False

    # -- heartbeats ------------------------------------------------------------------------------

    async def write_heartbeat(self, group: str, consumer: str, beat: bytes, *,
                              interval_s: float, last: bool = False) -> None:
        """An entry of the stream ``HEARTBEAT_TOPIC`` (field ``envelope``, so ``debatebus tail``
        shows it), trimmed to about ``HEARTBEAT_STREAM_MAXLEN`` entries."""
        async with self._call():
            await self._redis().xadd(HEARTBEAT_TOPIC, {ENVELOPE: beat},
                                     maxlen=HEARTBEAT_STREAM_MAXLEN, approximate=True)

    # -- reading outside any group ---------------------------------------------------------------

    async def subscribe(self, topics: Sequence[str]) -> AsyncIterator[Delivery]:
        await self.connect()
        return self._follow(topics, await self._last_ids(topics))

    async def _follow(self, topics: Sequence[str], last: dict[str, Any]) -> AsyncIterator[Delivery]:
        names = {topic.encode(): topic for topic in topics}
        try:
            while not self._closed:
                with self._reads.reading():
                    async with self._call(self._block_ms):
                        reply = await self._redis().xread(
                            last, count=_RANGE_PAGE, block=self._block_ms)  # type: ignore[arg-type]
                for name, entries in stream_entries(reply):
                    topic = names[name]
                    for entry_id, fields in entries:
                        last[topic] = entry_id
                        yield entry_to_delivery(topic, entry_id, fields)
        except TransportError:
            if not self._closed:
                raise

    async def _last_ids(self, topics: Sequence[str]) -> dict[str, Any]:
        # An explicit id, not "$" on every call: "$" would skip what arrives between two reads.
        pipe = self._redis().pipeline(transaction=False)
        for topic in topics:
            pipe.xrevrange(topic, "+", "-", count=1)
        async with self._call():
            replies: list[Any] = await pipe.execute()
        return {topic: reply[0][0] if reply else "0-0" for topic, reply in zip(topics, replies, strict=True)}

    async def read_range(self, topic: str, start: str = "-", end: str = "+",
                         count: int | None = None) -> AsyncIterator[Delivery]:
        """Entries of ``topic`` from ``start`` to ``end`` (inclusive ids, ``-``/``+`` for the
        ends), oldest first, at most ``count``: for operators replaying a stream or a DLQ."""
        await self.connect()
        left = count
        while left is None or left > 0:
            page = _RANGE_PAGE if left is None else min(_RANGE_PAGE, left)
            async with self._call():
                entries: Any = await self._redis().xrange(topic, start, end, count=page)
            for entry_id, fields in entries:
                yield entry_to_delivery(topic, entry_id, fields)
            if len(entries) < page:
                return
            last = entries[-1][0]
            start = "(" + (last.decode() if isinstance(last, bytes) else last)
            if left is not None:
                left -= len(entries)


def _seat_of(delivery: Delivery) -> _Seat:
    if not isinstance(delivery.token, _Seat):
        raise ConfigError("ack and reject take deliveries from consume(), not from subscribe() "
                          "or read_range()")
    return delivery.token
