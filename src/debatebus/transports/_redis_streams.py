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
  (``reject``) is written and acknowledged by the same script, under the same check. An entry
  gone from Redis (it restarted without its data, or the entry was trimmed) cannot be
  acknowledged and nobody else can answer it: its results are published anyway, marked
  ``RECOVERED_HEADER``;
* an entry idle past ``claim_idle_ms`` in the pending list of a consumer that died is taken over
  by a live one (``XAUTOCLAIM``), with its real delivery count. Live consumers refresh the idle
  time of what they hold every ``claim_idle_ms / 3``, so a debate that runs for minutes is never
  taken over while its worker is alive;
* every stream debatebus writes to (requests, results, dead letters, events) is trimmed by age:
  each ``XADD`` carries ``MINID ~ <now - topic_retention_s>``, and a consumer trims the streams
  it reads the same way (``XTRIM``) when it starts and then every tenth of the retention (at most
  every minute), so requests from producers that never trim age out too. Redis drops whole nodes
  of old entries, pending or not: see the rule in docs/operations.md ("Retention");
* a dead letter is an entry of ``{type}:dlq`` with the fields ``envelope`` (the original bytes,
  untouched), ``key``/``headers`` when the original had them, ``reason``, ``origin`` (the stream),
  ``originId`` and ``deliveries``. Reading it back maps those four into the headers
  ``x-debatebus-reason``, ``x-debatebus-origin``, ``x-debatebus-origin-id`` and
  ``x-debatebus-deliveries``.

Throughput: acks, rejects and publishes issued in the same event-loop tick share one pipeline
(``debatebus._redis``' batcher, one ``EVALSHA`` per ack), and each ``XREADGROUP`` fetches ``prefetch``
entries at once.

Outages: every call is bounded by ``command_timeout`` (blocking reads by ``block_ms`` more) and
fails with ``TransportError``; ``consume`` may be called again after one and carries on with the
same held entries, making the stream and group again if the server lost them. What this process
holds stays pending in Redis through an outage (the keep-alive resumes once Redis answers).

RESP2 and RESP3 (``?protocol=3``) clients both work: replies are read in either shape.

Redis Cluster (``?cluster=true``): a topic's stream is ``cluster_key(topic)``, its family as hash
tag (``debate:request`` → ``{debate:request}``), so the settle script's streams share one slot;
see ``debatebus._redis.cluster_key``. A ``consume`` over topics of several slots reads each slot on its own.
So ``ack`` publishes results only to topics of the request's family (``event:{type}:completed``
and the like): others are refused with a ``ConfigError``, the entry left held.

The consumer side (seats, reads, reclaiming, the keep-alive) is ``redis_groups``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Final

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from debatebus._redis import (
    Batcher,
    RedisClient,
    build_client,
    by_slot,
    check_client,
    check_one_slot,
    cluster_url,
    describe,
    is_cluster,
    open_batcher,
    seed_names,
    stream_key_rule,
)
from debatebus._retention import (
    DEFAULT_RETENTION_S,
    TOPIC_RETENTION_PARAM,
    retention_ms,
    take_retention,
)
from debatebus.exceptions import ConfigError, TransportError
from debatebus.transports._base import (
    HEARTBEAT_STREAM_MAXLEN,
    HEARTBEAT_TOPIC,
    RECOVERED_HEADER,
    Delivery,
    Outgoing,
    Transport,
    dlq_topic,
    refuse_partitions,
)
from debatebus.transports._redis_entries import (
    ENVELOPE,
    SETTLE,
    entry_to_delivery,
    field_map,
    message_fields,
    stream_entries,
)
from debatebus.transports._redis_groups import NOT_CONNECTED, ConsumerGroups, StreamsLink, seat_of
from debatebus.transports._redis_reads import log, merge

_RANGE_PAGE = 500
#: The retention must be at least this many times ``claim_idle_ms``: a pending entry older than
#: the retention is trimmed, so one retention must outlast many claim periods.
RETENTION_CLAIM_FACTOR: Final = 10
#: How often a consumer trims the streams it reads, at most (seconds): a tenth of the retention,
#: when that is shorter.
_TRIM_EVERY_S: Final = 60.0


def _keep_ms(retention_s: float, claim_idle_ms: int) -> int | None:
    """The stream retention in ms (None: never trim), checked against ``claim_idle_ms``."""
    keep_ms = retention_ms(retention_s, name="topic_retention_s")
    if keep_ms is not None and keep_ms < RETENTION_CLAIM_FACTOR * claim_idle_ms:
        raise ConfigError(
            f"topic_retention_s={retention_s:g} is too short for claim_idle_ms={claim_idle_ms}: "
            f"entries older than the retention are trimmed even while pending, so keep it at "
            f"least {RETENTION_CLAIM_FACTOR} × claim_idle_ms (in practice, days)")
    return keep_ms


def _trim_every_s(keep_ms: int | None) -> float:
    """How often a consumer trims what it reads: a tenth of the retention, at most a minute."""
    return _TRIM_EVERY_S if keep_ms is None else min(_TRIM_EVERY_S, keep_ms / 10_000)


class RedisStreamsTransport(Transport):
    """Redis Streams with consumer groups; see the module docstring for the wire format.

    ``client``: an existing ``redis.asyncio.Redis`` or ``RedisCluster`` (built with
    ``decode_responses=False``) to use instead of building one from ``url``; it is left open by
    ``close``, and keeps its own
    ``socket_timeout`` (redis-py's default is 5 s: keep ``block_ms`` below it).
    ``command_timeout`` bounds every call but the blocking reads, which get ``block_ms`` more.
    ``topic_retention_s``: how long stream entries are kept (``DEFAULT_RETENTION_S``, 7 days, as
    checkpoints; ``math.inf`` never trims), else the URL's ``?topic_retention=`` (``2d``, ``12h``,
    ``3600``, ``never``). It must be at least ``RETENTION_CLAIM_FACTOR × claim_idle_ms``, and in
    practice far more: an entry older than the retention is trimmed even while pending.
    """

    def __init__(self, url: str = "redis://localhost:6379/0", *, claim_idle_ms: int = 30_000,
                 block_ms: int = 1_000, topic_retention_s: float | None = None,
                 connect_timeout: float = 5.0, command_timeout: float = 10.0,
                 client: RedisClient | None = None) -> None:
        if claim_idle_ms < 10 or block_ms < 1:
            raise ConfigError("claim_idle_ms must be >= 10 and block_ms >= 1")
        if client is not None:
            check_client(client)
        url, from_url = take_retention(url, TOPIC_RETENTION_PARAM)
        self._keep_ms = _keep_ms(topic_retention_s if topic_retention_s is not None
                                 else from_url if from_url is not None else DEFAULT_RETENTION_S,
                                 claim_idle_ms)
        self._url = url
        self._connect_timeout = connect_timeout
        self._lost_said = False  # a request gone from Redis before it was settled was said
        self._owns_client = client is None
        cluster = is_cluster(client) if client is not None else cluster_url(url)
        self._link = StreamsLink(describe(url, client), command_timeout, block_ms, cluster,
                                 stream_key_rule(cluster), client)
        self._key = self._link.key
        self._groups = ConsumerGroups(self._link, claim_idle_ms=claim_idle_ms,
                                      submit=lambda commands: self._submit_to().submit(commands),
                                      trim=self._trim, trim_every_s=_trim_every_s(self._keep_ms))

    # -- lifecycle -------------------------------------------------------------------------------

    async def connect(self) -> None:
        link = self._link
        if link.batcher is not None:
            return
        if link.client is None:
            link.client = build_client(self._url, connect_timeout=self._connect_timeout)
        batcher = await open_batcher(link.client, link.where, timeout=link.timeout,
                                     seeds=seed_names(self._url))
        link.closed, link.batcher = False, batcher
        self._groups.start()

    async def close(self) -> None:
        link = self._link
        link.closed = True
        await link.reads.wait_idle(link.block_ms / 1000 + 1.0)
        await self._groups.stop()
        if link.batcher is not None:
            batcher, link.batcher = link.batcher, None
            await batcher.stop()
        if link.client is not None and self._owns_client:
            client, link.client = link.client, None
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await client.aclose()

    def topic_name(self, topic: str) -> str:
        return self._key(topic)

    def _submit_to(self) -> Batcher:
        if self._link.batcher is None:
            raise TransportError(NOT_CONNECTED)
        return self._link.batcher

    # -- publishing and settling -----------------------------------------------------------------

    def _min_id(self) -> str:
        """The oldest entry id kept now: now − the retention ('' when nothing is trimmed)."""
        if self._keep_ms is None:
            return ""
        return f"{time.time_ns() // 1_000_000 - self._keep_ms}-0"

    def _trim(self) -> tuple[Any, ...]:
        """``XADD``/``XTRIM`` arguments dropping entries older than the retention, a whole node of
        the stream at a time (``~``: cheap, and it keeps a few older entries)."""
        min_id = self._min_id()
        return ("MINID", "~", min_id) if min_id else ()

    def _xadd(self, topic: str, fields: list[Any]) -> tuple[Any, ...]:
        return ("XADD", self._key(topic), *self._trim(), "*", *fields)

    async def publish(self, message: Outgoing) -> str:
        command = self._xadd(message.topic, message_fields(message.body, message.key, message.headers))
        (entry_id,) = await self._submit_to().submit((command,))
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    async def ack(self, delivery: Delivery, results: Sequence[Outgoing] = ()) -> None:
        """Publish ``results`` and acknowledge, atomically, if the entry is still pending in the
        group; if it is not (settled already, e.g. by this same ack whose reply was lost),
        publish nothing. Idempotent: safe to retry after a ``TransportError``. Until it succeeds
        the entry stays held (kept alive): retry it, or ``release`` it."""
        await self._settle(delivery, lambda marks: [
            (r.topic, message_fields(r.body, r.key, {**r.headers, **marks} if marks else r.headers))
            for r in results])

    async def reject(self, delivery: Delivery, reason: str, *, requeue: bool = False) -> None:
        """``requeue``: let go of the entry now, so the next ``XAUTOCLAIM`` (this consumer's or
        another's) hands it out again, counted. Otherwise write the dead letter and acknowledge,
        as ``ack`` does (same pending check, same retry rules)."""
        if not requeue:
            await self._settle(delivery, lambda marks: [
                (dlq_topic(delivery.topic), self._dead_letter_fields(delivery, reason, marks))])
            return
        await self._groups.requeue(delivery)

    def release(self, delivery: Delivery) -> None:
        """Stop keeping the entry alive: it stays pending and any consumer's ``XAUTOCLAIM``
        takes it once it has been idle for ``claim_idle_ms``."""
        self._groups.release(delivery)

    async def _settle(self, delivery: Delivery,
                      outputs_for: Callable[[Mapping[str, str]], list[tuple[str, list[Any]]]],
                      ) -> None:
        """Run the settle script on what ``outputs_for({})`` gives, (stream, fields) to publish,
        trimmed by age. If the request is gone from Redis (the script's -1), publish what
        ``outputs_for`` gives with ``RECOVERED_HEADER`` instead, and say so."""
        seat = seat_of(delivery)
        outputs = outputs_for({})
        keys = [seat.key, *(self._key(topic) for topic, _ in outputs)]
        if self._link.cluster:
            check_one_slot(keys, "a request stream and what its settle publishes")
        args: list[Any] = [seat.group, delivery.id, self._min_id()]
        for _, fields in outputs:
            args += (len(fields), *fields)
        settled = await SETTLE.run(self._submit_to(), keys, args)
        if settled == -1:
            await self._submit_to().submit([self._xadd(topic, fields) for topic, fields in
                                            outputs_for({RECOVERED_HEADER: "request-lost"})])
            self._said_lost(seat.topic, delivery.id)
        elif not settled:
            log.debug("%s %s was settled already: nothing published", seat.topic, delivery.id)
        seat.inflight.discard(delivery.id)

    def _said_lost(self, topic: str, entry_id: str) -> None:
        """Loudly, the first time (a Redis that lost its data loses every request in flight at
        once); each one after at INFO."""
        level = logging.INFO if self._lost_said else logging.WARNING
        self._lost_said = True
        log.log(level, "request %s on %s was gone from Redis before it was settled (did Redis "
                "restart without its data, or was the stream trimmed while it ran?): its answer "
                "is published anyway, marked %s; nobody else can answer it",
                entry_id, topic, RECOVERED_HEADER)

    def _dead_letter_fields(self, delivery: Delivery, reason: str,
                            marks: Mapping[str, str] | None = None) -> list[Any]:
        headers = {**delivery.headers, **marks} if marks else delivery.headers
        return [*message_fields(delivery.body, delivery.key, headers),
                b"reason", reason, b"origin", delivery.topic, b"originId", delivery.id,
                b"deliveries", delivery.deliveries]

    async def dead_letter(self, delivery: Delivery, reason: str) -> str:
        """Write ``delivery`` to ``{topic}:dlq`` without acknowledging anything: for messages that
        did not come from a consumer group (Redis pub/sub keeps its dead letters here)."""
        command = self._xadd(dlq_topic(delivery.topic), self._dead_letter_fields(delivery, reason))
        (entry_id,) = await self._submit_to().submit([command])
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    # -- consuming -------------------------------------------------------------------------------

    async def ensure_topics(self, topics: Sequence[str]) -> None:
        """Streams and groups are made on first consume; nothing has to exist beforehand."""

    async def consume(self, topics: Sequence[str], *, group: str, consumer: str,
                      prefetch: int = 16) -> AsyncIterator[Delivery]:
        if prefetch < 1 or not topics:
            raise ConfigError("consume needs at least one topic and prefetch >= 1")
        await self.connect()
        # Closed with this generator, so what it read but never handed out is let go at once.
        async with contextlib.aclosing(self._groups.consume(
                topics, group=group, consumer=consumer, prefetch=prefetch)) as deliveries:
            async for delivery in deliveries:
                yield delivery

    # -- heartbeats ------------------------------------------------------------------------------

    async def write_heartbeat(self, group: str, consumer: str, beat: bytes, *,
                              interval_s: float, last: bool = False) -> None:
        """An entry of the stream ``HEARTBEAT_TOPIC`` (field ``envelope``, so ``debatebus tail``
        shows it), trimmed to about ``HEARTBEAT_STREAM_MAXLEN`` entries."""
        await self._submit_to().submit([("XADD", HEARTBEAT_TOPIC, "MAXLEN", "~",
                                         HEARTBEAT_STREAM_MAXLEN, "*", ENVELOPE, beat)])

    # -- reading outside any group ---------------------------------------------------------------

    async def subscribe(self, topics: Sequence[str]) -> AsyncIterator[Delivery]:
        await self.connect()
        groups = by_slot(topics, self._key) if self._link.cluster else [list(topics)]
        followers = [self._follow(group, await self._last_ids(group)) for group in groups]
        return followers[0] if len(followers) == 1 else merge(*followers)

    async def _follow(self, topics: Sequence[str], last: dict[str, Any]) -> AsyncIterator[Delivery]:
        """``last``: the last entry id seen, by stream key."""
        names = {self._key(topic).encode(): topic for topic in topics}
        link = self._link

        async def read(redis: Redis) -> Any:
            return await redis.xread(last, count=_RANGE_PAGE, block=link.block_ms)  # type: ignore[arg-type]

        try:
            while not link.closed:
                with link.reads.reading():
                    reply = await link.on(self._key(topics[0]), read, link.block_ms)
                for name, entries in stream_entries(reply):
                    topic = names[name]
                    for entry_id, fields in entries:
                        last[name.decode()] = entry_id
                        yield entry_to_delivery(topic, entry_id, fields)
        except TransportError:
            if not link.closed:
                raise

    async def _last_ids(self, topics: Sequence[str]) -> dict[str, Any]:
        # An explicit id, not "$" on every call: "$" would skip what arrives between two reads.
        keys = [self._key(topic) for topic in topics]
        replies = await self._submit_to().submit([("XREVRANGE", key, "+", "-", "COUNT", 1)
                                                  for key in keys])
        return {key: reply[0][0] if reply else "0-0" for key, reply in zip(keys, replies, strict=True)}

    async def read_range(self, topic: str, start: str = "-", end: str = "+",
                         count: int | None = None, *,
                         partitions: Sequence[int] | None = None) -> AsyncIterator[Delivery]:
        """Entries of ``topic`` from ``start`` to ``end`` (inclusive ids, ``-``/``+`` for the
        ends), oldest first, at most ``count``: for operators replaying a stream or a DLQ, or
        listing failures. Each carries its entry id's time as ``timestamp_ms``."""
        refuse_partitions(self, partitions)
        await self.connect()
        left = count
        while left is None or left > 0:
            page = _RANGE_PAGE if left is None else min(_RANGE_PAGE, left)
            key = self._key(topic)
            [entries] = await self._submit_to().submit([("XRANGE", key, start, end, "COUNT", page)])
            for entry_id, fields in entries:
                delivery = entry_to_delivery(topic, entry_id, field_map(fields))
                delivery.timestamp_ms = int(delivery.id.partition("-")[0])
                yield delivery
            if len(entries) < page:
                return
            last = entries[-1][0]
            start = "(" + (last.decode() if isinstance(last, bytes) else last)
            if left is not None:
                left -= len(entries)

