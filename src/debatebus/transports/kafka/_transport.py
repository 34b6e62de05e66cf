"""Kafka transport on aiokafka: one topic per event type, one consumer group per worker pool.

Wire format: see ``wire`` and ``names``. Topics are created with the admin client before first
use, never left to broker auto-creation (``topics``).

Delivery is at-least-once. Kafka acknowledges by committing an offset per partition, not per
message, and a worker finishes debates out of order, so an offset is committed only when every
record before it in its partition is settled, and only after that record's results were produced.
A crash between producing results and committing redelivers the request. A ``DebateHandler``
with a checkpoint store answers it again from the store (keyed by debate id, the request id by
default) instead of running the debate twice. On Kafka no store is chosen by default (on Redis
the broker's own is): give the handler one (``store=``), or the worker logs a WARNING at start and
a redelivered request runs again and publishes a second result. aiokafka's idempotent producer
and transactions are not used: Tansu (the test broker) has neither, and exactly-once could not
cover the LLM calls anyway.

A record too large to produce (results, a dead letter, a publish) raises
``MessageTooLargeError`` before anything of that call is produced, and leaves the delivery
unsettled, so the caller can settle it another way. A broker that restarted without its data
(Tansu's ``memory://``) has the topics re-created on first use, and consumers start over at the
beginning of its new logs.

How a consumer stays in its group however long a debate takes, how a released or requeued
delivery is handed out again, and how closing a ``consume()`` iterator lets in-flight deliveries
still commit: see ``group``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from debatebus._retention import DEFAULT_RETENTION_S
from debatebus.exceptions import ConfigError, MessageTooLargeError, TransportError
from debatebus.transports._base import Delivery, Outgoing, Transport
from debatebus.transports.kafka._errors import (
    QuietOutage,
    kafka_errors,
    logger,
    lost_topic,
    producing,
    quietly,
    too_large,
)
from debatebus.transports.kafka._group import Member
from debatebus.transports.kafka._names import kafka_topic, topic_names
from debatebus.transports.kafka._offsets import Mark
from debatebus.transports.kafka._readers import Subscription, bounds, millis, poll, record_at
from debatebus.transports.kafka._settings import KafkaSettings, parse_servers
from debatebus.transports.kafka._topics import Topics
from debatebus.transports.kafka._wire import (
    Record,
    Token,
    dead_letter,
    size_of,
    to_delivery,
    to_record,
    token_of,
)


class KafkaTransport(Transport):
    """Kafka (or any Kafka-protocol broker) through aiokafka. See the module docstring.

    ``bootstrap_servers``: ``"host:port"``, ``"h1:p1,h2:p2"`` or a list. ``partitions``,
    ``replication_factor`` and ``topic_retention_s`` (their ``retention.ms``: 7 days by default,
    as checkpoints; ``math.inf`` keeps records forever) apply to the topics this transport
    creates; topics that exist keep their own. ``revoke_grace_ms``: how
    long a rebalance waits for in-flight deliveries of revoked partitions to be settled before
    committing and letting go (longer ones are redelivered to the new owner). ``linger_ms``: how
    long a produced record waits for others to share its request (fewer, larger requests: less
    CPU per message for a few ms of latency). Offset commits need no timer: acks share the commit
    after the one in flight.
    """

    #: ``read_range`` positions are per-partition offsets (or times), not stream ids.
    position_kind = "offset"

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        partitions: int = 3,
        replication_factor: int = 1,
        topic_retention_s: float = DEFAULT_RETENTION_S,
        connect_timeout: float = 10.0,
        request_timeout: float = 30.0,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 3_000,
        max_poll_interval_ms: int = 300_000,
        revoke_grace_ms: int = 3_000,
        fetch_max_wait_ms: int = 100,
        linger_ms: int = 5,
        max_request_size: int = 1_048_576,
        client_id: str = "debatebus",
    ) -> None:
        self.settings = KafkaSettings(
            servers=parse_servers(bootstrap_servers), partitions=partitions,
            replication_factor=replication_factor, topic_retention_s=topic_retention_s,
            connect_timeout=connect_timeout,
            request_timeout=request_timeout, session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms, max_poll_interval_ms=max_poll_interval_ms,
            revoke_grace_ms=revoke_grace_ms, fetch_max_wait_ms=fetch_max_wait_ms,
            linger_ms=linger_ms, max_request_size=max_request_size, client_id=client_id)
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._connect_lock = asyncio.Lock()
        self._topics = Topics(self.settings, self._admin_client)
        self._members: set[Member] = set()
        self._readers: set[AIOKafkaConsumer] = set()
        self._quiet = QuietOutage(self)

    # -- connections -----------------------------------------------------------------------

    async def connect(self) -> None:
        # Held from the first try: a broker that is down shows its first error, not each retry's.
        self._quiet.hold()
        await self._ready()
        self._quiet.release()

    async def _ready(self) -> tuple[AIOKafkaProducer, AIOKafkaAdminClient]:
        """The producer and admin client, connecting them on first use."""
        if self._producer is None or self._admin is None:
            async with self._connect_lock:
                if self._producer is None or self._admin is None:
                    self._producer, self._admin = await self._connect()
        return self._producer, self._admin

    async def _admin_client(self) -> AIOKafkaAdminClient:
        return (await self._ready())[1]

    async def _connect(self) -> tuple[AIOKafkaProducer, AIOKafkaAdminClient]:
        timeout_ms = int(self.settings.request_timeout * 1000)
        settings = self.settings
        producer = AIOKafkaProducer(bootstrap_servers=settings.servers,
                                    client_id=settings.client_id, **settings.producer_options)
        await self._start(producer.start, producer.stop, "connecting the producer")
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.servers,
                                    client_id=settings.client_id, request_timeout_ms=timeout_ms)
        try:
            await self._start(admin.start, admin.close, "connecting the admin client")
        except TransportError:
            await quietly(producer.stop(), "stopping the producer", self.settings.request_timeout)
            raise
        return producer, admin

    async def _start(self, start: Callable[[], Awaitable[Any]],
                     stop: Callable[[], Awaitable[Any]], what: str) -> None:
        """Start a client within ``connect_timeout``, stopping it again if that fails."""
        try:
            async with asyncio.timeout(self.settings.connect_timeout):
                with kafka_errors(what, self.settings.servers):
                    await start()
        except TimeoutError as exc:
            await quietly(stop(), what, self.settings.request_timeout)
            raise TransportError(
                f"Kafka: {what} timed out after {self.settings.connect_timeout:g}s; check that a broker "
                f"listens at {self.settings.servers} and that the address it advertises is reachable "
                "from this host") from exc
        except TransportError:
            await quietly(stop(), what, self.settings.request_timeout)
            raise

    async def close(self) -> None:
        """Commit what is settled, leave the groups, flush and stop the producer. Deliveries
        still unsettled stay uncommitted: the partitions' next owners redeliver them."""
        members, self._members = self._members, set()
        try:
            await asyncio.gather(*(m.stop() for m in members),
                                 *(self._drop_reader(r) for r in list(self._readers)))
            producer, admin = self._producer, self._admin
            self._producer = self._admin = None
            self._topics.forget()  # a restarted broker may have lost them (Tansu's memory://)
            if producer is not None:
                await quietly(producer.stop(), "flushing the producer",
                              self.settings.request_timeout)
            if admin is not None:
                await quietly(admin.close(), "closing the admin client",
                              self.settings.request_timeout)
        finally:  # once the clients stopped: a producer flushing to a lost broker retries too
            self._quiet.release()

    # -- topics ----------------------------------------------------------------------------

    def topic_name(self, topic: str) -> str:
        return kafka_topic(topic)

    async def ensure_topics(self, topics: Sequence[str]) -> None:
        await self._topics.ensure(topic_names(topics))

    async def _partitions_of(self, name: str) -> list[TopicPartition]:
        producer, _ = await self._ready()
        with kafka_errors(f"reading the partitions of {name}", self.settings.servers):
            numbers = await producer.partitions_for(name)
        return [TopicPartition(name, p) for p in sorted(numbers)]

    # -- producing -------------------------------------------------------------------------

    async def _send(self, records: Sequence[Record]) -> list[Any]:
        """Produce and wait for the broker's acknowledgement of every record. Topics the broker
        no longer knows (it restarted without its data) are created again, once."""
        if not records:
            return []
        size = max(size_of(r) for r in records)
        topics = {r.topic for r in records}
        if size > self.settings.max_request_size:  # checked before producing any: a call fails whole
            raise too_large(topics, size, self.settings.max_request_size, by_broker=False)
        try:
            produced = await self._produce(records, topics, size)
        except MessageTooLargeError:
            raise
        except TransportError as exc:
            if not lost_topic(exc):
                self._quiet.hold()  # the broker is unreachable (or refuses): quiet until it answers
                raise
            logger.warning("%s; ensuring the topics exist and producing again", exc)
            await self._topics.recheck(topics)
            produced = await self._produce(records, topics, size)
        self._quiet.release()
        return produced

    async def _produce(self, records: Sequence[Record], topics: set[str],
                       size: int) -> list[Any]:
        producer, _ = await self._ready()
        await self._topics.ensure(topics)
        with producing(topics, self.settings.servers, size=size,
                        limit=self.settings.max_request_size):
            # send() only appends to the batch; awaiting them together lets them share requests.
            futures = [await producer.send(r.topic, r.value, key=r.key, headers=list(r.headers))
                       for r in records]
            if len(futures) == 1:  # an ack's one result: no gather to build
                return [await futures[0]]
            return list(await asyncio.gather(*futures))

    async def publish(self, message: Outgoing) -> str:
        (meta,) = await self._send([to_record(message)])
        return f"{meta.partition}:{meta.offset}"

    # -- settling --------------------------------------------------------------------------

    async def ack(self, delivery: Delivery, results: Sequence[Outgoing] = ()) -> None:
        """Produce ``results``, then mark the delivery settled and commit the settled prefix.
        Not atomic: a crash in between redelivers the request (see the module docstring). An
        ack retried after its commit failed only commits: the results were produced already."""
        token = token_of(delivery)
        if not self._settled(token):
            await self._send([to_record(m) for m in results])
        await self._settle(token)

    async def reject(self, delivery: Delivery, reason: str, *, requeue: bool = False) -> None:
        """``requeue``: hand the delivery out again from this consumer, like ``release``.
        Otherwise copy it to ``{topic}:dlq`` with the reason and settle it."""
        token = token_of(delivery)
        if requeue:
            self.release(delivery)
            return
        if not self._settled(token):
            await self._send([dead_letter(delivery, token, reason)])
        await self._settle(token)

    def release(self, delivery: Delivery) -> None:
        """Hand ``delivery`` out again from the consumer that received it, counting one more
        delivery; its offset stays uncommitted until it is settled, other records of its
        partition flow meanwhile. A no-op once that consumer lost the partition or closed: the
        partition's next owner redelivers it."""
        token = delivery.token
        if isinstance(token, Token) and token.member is not None:
            token.member.release(delivery)

    def slot_lent(self, delivery: Delivery, lent: bool) -> None:
        """While ``delivery``'s handler waits with its slot lent out, its record does not count
        toward the consumer's ``prefetch`` (see ``group``): what it waits for can be fetched."""
        token = delivery.token
        if isinstance(token, Token) and token.member is not None:
            token.member.lend(token, lent)

    @staticmethod
    def _settled(token: Token) -> bool:
        return token.member is not None and token.member.is_settled(token)

    async def _settle(self, token: Token) -> None:
        member = token.member
        if member is None:
            return
        member.settle(token)
        try:
            await member.commit()  # also what an earlier, failed commit left due
        except TransportError:
            # A broker that lost the topics refuses commits until they exist again.
            with contextlib.suppress(TransportError):
                await self._topics.recheck(member.names)
            raise

    # -- consuming -------------------------------------------------------------------------

    async def consume(
        self, topics: Sequence[str], *, group: str, consumer: str, prefetch: int = 16
    ) -> AsyncIterator[Delivery]:
        if prefetch < 1:
            raise ConfigError(f"prefetch must be at least 1, not {prefetch}")
        names = topic_names(topics)
        await self._topics.ensure(names)
        member = self._detached(group, names) or await self._join(group, names, consumer,
                                                                   prefetch)
        member.attach()
        try:
            while (delivery := await member.next()) is not None:
                yield delivery
        finally:
            # Stops fetching only: what was handed out still commits when settled, until close().
            member.detach()

    def _detached(self, group: str, names: dict[str, str]) -> Member | None:
        """A member of ``group`` on ``names`` whose iterator closed (an error, or a worker
        consuming again after one): the new iterator takes it over, in-flight deliveries and
        all."""
        return next((m for m in self._members if not m.attached and not m.stopped
                     and m.group == group and m.names == names), None)

    async def _join(self, group: str, names: dict[str, str], consumer: str,
                    prefetch: int) -> Member:
        kafka_consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.servers, client_id=f"{self.settings.client_id}-{consumer}",
            group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
            max_poll_records=prefetch, **self.settings.group_options,
            **self.settings.fetch_options)
        await self._start(kafka_consumer.start, kafka_consumer.stop, f"joining group {group!r}")
        member = Member(kafka_consumer, names, group, prefetch, self.settings,
                        recheck=self._topics.recheck, mark_at=self._mark_at)
        self._members.add(member)
        member.start()
        return member

    async def _mark_at(self, tp: TopicPartition, offset: int) -> Mark | None:
        """What the record at ``offset`` of ``tp`` holds now; None if there is none."""
        reader = await self._reader()
        try:
            reader.assign([tp])
            reader.seek(tp, offset)
            record = await record_at(reader, tp, offset, servers=self.settings.servers,
                                      timeout=self.settings.request_timeout)
        finally:
            await self._drop_reader(reader)
        return None if record is None else Mark(record.timestamp, record.key)

    async def _reader(self) -> AIOKafkaConsumer:
        """A group-less consumer: reads wherever it is told to, commits nothing."""
        reader = AIOKafkaConsumer(bootstrap_servers=self.settings.servers, client_id=self.settings.client_id,
                                  group_id=None, enable_auto_commit=False, **self.settings.fetch_options)
        await self._start(reader.start, reader.stop, "starting a reader")
        self._readers.add(reader)
        return reader

    async def _drop_reader(self, reader: AIOKafkaConsumer) -> None:
        self._readers.discard(reader)
        await quietly(reader.stop(), "stopping a reader", self.settings.request_timeout)

    async def subscribe(self, topics: Sequence[str]) -> AsyncIterator[Delivery]:
        """A group-less reader positioned at the end of every partition of ``topics`` by the
        time this returns, so nothing published afterwards is missed."""
        names = topic_names(topics)
        await self._topics.ensure(names)  # so there are partitions to position on right away
        reader = await self._reader()
        try:
            tps = [tp for name in names for tp in await self._partitions_of(name)]
            reader.assign(tps)
            with kafka_errors("seeking to the end", self.settings.servers):
                await reader.seek_to_end(*tps)
                for tp in tps:  # resolves any reset still pending: the position is fixed now
                    await reader.position(tp)
        except BaseException:
            await self._drop_reader(reader)
            raise
        return Subscription(reader, names, self.settings.servers,
                             functools.partial(self._drop_reader, reader))

    # -- ops replay ------------------------------------------------------------------------

    async def read_range(
        self,
        topic: str,
        start: int | datetime | None = None,
        end: int | datetime | None = None,
        *,
        partitions: Sequence[int] | None = None,
    ) -> AsyncIterator[Delivery]:
        """Records of ``topic`` from ``start`` to ``end``, both inclusive, for ops replay and
        failure listings; each with its record time as ``timestamp_ms``.

        Integers are offsets, counted in each partition and applied to every one (restrict with
        ``partitions``: ``ConfigError`` for one the topic does not have); datetimes are record
        timestamps (naive ones are local time); None is open. Reads up to the end of each
        partition as it was when called, so a replay that re-publishes to the same topic ends.
        Partition by partition, not in global order. Nothing for a topic that does not exist.
        Nothing to settle.
        """
        name = kafka_topic(topic)
        if not await self._topics.exists(name):
            return
        tps = _chosen(name, await self._partitions_of(name), partitions)
        reader = await self._reader()
        try:
            reader.assign(tps)
            spans = await bounds(reader, tps, start, end, servers=self.settings.servers,
                                 timeout=self.settings.request_timeout)
            active = {tp for tp, (lo, hi) in spans.items() if lo < hi}
            for tp in active:
                reader.seek(tp, spans[tp][0])
            low, high = millis(start, float("-inf")), millis(end, float("inf"))
            while active:
                records = await poll(reader, *active, servers=self.settings.servers)
                if records is None:
                    return
                for record in records:
                    tp = TopicPartition(record.topic, record.partition)
                    if tp in active and record.offset < spans[tp][1] and \
                            low <= record.timestamp <= high:
                        delivery = to_delivery(record, topic)
                        delivery.timestamp_ms = record.timestamp
                        yield delivery
                active = {tp for tp in active if await reader.position(tp) < spans[tp][1]}
        finally:
            await self._drop_reader(reader)


def _chosen(name: str, tps: list[TopicPartition],
            partitions: Sequence[int] | None) -> list[TopicPartition]:
    """The partitions of ``tps`` numbered in ``partitions`` (all of them for None)."""
    if partitions is None:
        return tps
    have = {tp.partition for tp in tps}
    missing = sorted(set(partitions) - have)
    if missing:
        raise ConfigError(f"Kafka topic {name!r} has partitions "
                          f"{', '.join(map(str, sorted(have)))}: there is no partition "
                          f"{', '.join(map(str, missing))}")
    return [tp for tp in tps if tp.partition in set(partitions)]
