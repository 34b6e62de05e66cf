"""Kafka transport on aiokafka: one topic per event type, one consumer group per worker pool.

Wire format: topic = the event type with ``:`` replaced by ``.`` (Kafka forbids ``:``); key = the
requestId; value = the JSON envelope; headers ``content-type: application/json`` and
``x-debatebus-schema-version`` plus the message's own. Topics are created with the admin client
before first use, never left to broker auto-creation (which would pick its own partition count).

Delivery is at-least-once. Kafka acknowledges by committing an offset per partition, not per
message, and a worker finishes debates out of order, so an offset is committed only when every
record before it in its partition is settled, and only after that record's results were produced.
A crash between producing results and committing redelivers the request; the handler layer
dedups by request id. aiokafka's idempotent producer and transactions are not used: Tansu (the
test broker) has neither, and exactly-once could not cover the LLM calls anyway.

Liveness: a background task keeps calling ``getmany`` whatever the handlers are doing; when
``prefetch`` records are unsettled it pauses the assigned partitions instead of not polling. So
the consumer keeps heartbeating and its ``max_poll_interval_ms`` clock (which aiokafka measures
between ``getmany`` calls, not between messages) never runs out, however long a debate takes:
the default 300 000 ms is fine and only bounds a wedged event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, NamedTuple

from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    ConsumerStoppedError,
    IllegalOperation,
    TopicPartition,
)
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    CommitFailedError,
    GroupAuthorizationFailedError,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    for_code,
)

from debatebus.exceptions import ConfigError, TransportError
from debatebus.schemas.envelope import SCHEMA_VERSION
from debatebus.transports.base import Delivery, Outgoing, Transport, dlq_topic

__all__ = [
    "CONTENT_TYPE_HEADER",
    "DELIVERIES_HEADER",
    "ORIGIN_HEADER",
    "ORIGIN_OFFSET_HEADER",
    "ORIGIN_PARTITION_HEADER",
    "REASON_HEADER",
    "SCHEMA_HEADER",
    "KafkaTransport",
    "kafka_topic",
]

logger = logging.getLogger(__name__)

CONTENT_TYPE_HEADER: Final = "content-type"
SCHEMA_HEADER: Final = "x-debatebus-schema-version"
REASON_HEADER: Final = "x-debatebus-reason"
DELIVERIES_HEADER: Final = "x-debatebus-deliveries"
ORIGIN_HEADER: Final = "x-debatebus-origin"
ORIGIN_PARTITION_HEADER: Final = "x-debatebus-origin-partition"
ORIGIN_OFFSET_HEADER: Final = "x-debatebus-origin-offset"
_DLQ_HEADERS: Final = frozenset({REASON_HEADER, ORIGIN_HEADER, ORIGIN_PARTITION_HEADER,
                                 ORIGIN_OFFSET_HEADER})

_POLL_MS: Final = 200  # how long one getmany waits when idle; bounds the fetch loop's reaction time
_ASSIGNMENT_WATCH_S: Final = 60
_LEGAL_TOPIC: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")
_KAFKA_ERRORS: Final = (KafkaError, ConsumerStoppedError, IllegalOperation)

RawHeaders = tuple[tuple[str, bytes], ...]

_HINTS: Final[tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...]] = (
    (KafkaConnectionError, "check that a broker listens at {servers} and that the address it "
                           "advertises is reachable from this host"),
    (CommitFailedError, "the group rebalanced and the partition moved to another consumer, which "
                        "redelivers from the last commit"),
    ((MessageSizeTooLargeError, RecordTooLargeError),
     "the message exceeds the producer's max_request_size or the topic's max.message.bytes"),
    ((TopicAuthorizationFailedError, GroupAuthorizationFailedError),
     "check this client's ACLs on the broker"),
    ((KafkaTimeoutError, RequestTimedOutError),
     "the broker at {servers} did not answer in time: check it is up and not overloaded"),
)


def _translate(exc: BaseException, action: str, servers: str) -> TransportError:
    hint = next((h for kinds, h in _HINTS if isinstance(exc, kinds)),
                "check the broker at {servers} and its logs")
    error = TransportError(f"Kafka: {action} failed ({type(exc).__name__}: {exc}); "
                           f"{hint.format(servers=servers)}")
    error.__cause__ = exc
    return error


@contextlib.contextmanager
def _kafka_errors(action: str, servers: str) -> Iterator[None]:
    """Callers see ``TransportError`` (saying what to check), never an aiokafka exception."""
    try:
        yield
    except _KAFKA_ERRORS as exc:
        raise _translate(exc, action, servers) from exc


@functools.lru_cache(maxsize=1024)
def kafka_topic(event_type: str) -> str:
    """The Kafka topic carrying ``event_type``: ``debate:request`` → ``debate.request``."""
    name = event_type.replace(":", ".")
    if not _LEGAL_TOPIC.fullmatch(name) or name in (".", ".."):
        raise ConfigError(f"event type {event_type!r} maps to Kafka topic {name!r}, which Kafka "
                          "rejects: use letters, digits and . _ - : only, at most 249 characters")
    return name


def _names(topics: Sequence[str]) -> dict[str, str]:
    """Kafka topic → the event type the caller used, to give deliveries their original names."""
    if isinstance(topics, str) or not topics:
        raise ConfigError(f"pass a non-empty list of event types, not {topics!r}")
    names: dict[str, str] = {}
    for event_type in topics:
        first = names.setdefault(kafka_topic(event_type), event_type)
        if first != event_type:
            raise ConfigError(f"event types {first!r} and {event_type!r} both map to Kafka topic "
                              f"{kafka_topic(first)!r}: rename one of them")
    return names


def _encode_headers(headers: dict[str, str]) -> RawHeaders:
    return tuple((k, v.encode()) for k, v in headers.items())


def _deliveries(headers: dict[str, str]) -> int:
    try:
        return max(1, int(headers.get(DELIVERIES_HEADER, "1")))
    except ValueError:
        return 1


class _Record(NamedTuple):
    topic: str
    value: bytes
    key: bytes | None
    headers: RawHeaders


def _outgoing(message: Outgoing) -> _Record:
    headers = {CONTENT_TYPE_HEADER: "application/json", SCHEMA_HEADER: str(SCHEMA_VERSION),
               **message.headers}
    key = message.key.encode() if message.key is not None else None
    return _Record(kafka_topic(message.topic), message.body, key, _encode_headers(headers))


@dataclass(eq=False, slots=True)
class _Partition:
    """Offsets fetched from one assigned partition, in fetch order, for contiguous commits.

    ``fetched`` may have gaps (compaction, transaction markers): contiguity is over fetched
    records, not integers. A fresh object per assignment, so a late settle for a revoked
    partition is recognised by identity and never commits for the partition's new owner.
    """

    fetched: deque[int] = field(default_factory=deque)
    unsettled: set[int] = field(default_factory=set)
    commit_at: int | None = None  # one past the settled prefix: what Kafka should store
    committed: int | None = None

    def add(self, offset: int) -> None:
        self.fetched.append(offset)
        self.unsettled.add(offset)

    def settle(self, offset: int) -> bool:
        if offset not in self.unsettled:
            return False
        self.unsettled.discard(offset)
        while self.fetched and self.fetched[0] not in self.unsettled:
            self.commit_at = self.fetched.popleft() + 1
        return True

    def forget_from(self, offset: int) -> int:
        """Drop the fetched tail from ``offset`` on (never handed out); returns how many."""
        dropped = 0
        while self.fetched and self.fetched[-1] >= offset:
            self.unsettled.discard(self.fetched.pop())
            dropped += 1
        return dropped


@dataclass(frozen=True, slots=True)
class _Token:
    tp: TopicPartition
    offset: int
    raw_key: bytes | None
    raw_headers: RawHeaders
    member: _Member | None = None  # None: from subscribe/read_range, nothing to settle
    partition: _Partition | None = None


def _delivery(record: Any, event_type: str, member: _Member | None = None,
              partition: _Partition | None = None) -> Delivery:
    raw: RawHeaders = tuple((k, v or b"") for k, v in record.headers or ())
    headers = {k: v.decode("utf-8", "replace") for k, v in raw}
    key = record.key.decode("utf-8", "replace") if record.key is not None else None
    tp = TopicPartition(record.topic, record.partition)
    return Delivery(event_type, record.value or b"", f"{record.partition}:{record.offset}",
                    _deliveries(headers), key, headers,
                    token=_Token(tp, record.offset, record.key, raw, member, partition))


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka has no type hints
    def __init__(self, member: _Member) -> None:
        self.member = member

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self.member.on_revoked(set(revoked))

    def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self.member.paused = False
        logger.debug("group %s: assigned %s", self.member.group, sorted(assigned))


class _Member:
    """One ``consume()`` call: a group consumer, its fetch loop and its commit bookkeeping."""

    def __init__(self, consumer: AIOKafkaConsumer, names: dict[str, str], group: str,
                 prefetch: int, settings: KafkaTransport) -> None:
        self.consumer = consumer
        self.names = names
        self.group = group
        self.prefetch = prefetch
        self.settings = settings
        self.parts: dict[TopicPartition, _Partition] = {}
        self.buffer: deque[Delivery] = deque()
        self.unsettled = 0  # fetched (buffered or handed out) and not yet settled
        self.ready = asyncio.Event()
        self.settled = asyncio.Event()
        self.error: TransportError | None = None
        self.stopped = False
        self.paused = False  # a new assignment starts unpaused: the listener resets this
        self._fetcher: asyncio.Task[None] | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._stopping: asyncio.Future[None] | None = None
        self._commit_lock = asyncio.Lock()
        self._commit_wanted = False

    def start(self) -> None:
        self.consumer.subscribe(list(self.names), listener=_Listener(self))
        self._fetcher = asyncio.create_task(self._fetch_loop(), name=f"kafka-fetch-{self.group}")
        self._watch = asyncio.get_running_loop().call_later(_ASSIGNMENT_WATCH_S,
                                                            self._warn_if_unassigned)

    def _warn_if_unassigned(self) -> None:
        # A member that never gets partitions just waits, silently; say so once.
        if not self.stopped and not self.consumer.assignment():
            logger.warning(
                "group %s: no partitions assigned after %ds. Normal if the group has more members "
                "than %s have partitions; otherwise check the broker. (Tansu 0.6 strands a group "
                "whose leader was the last member to leave: restart it or use a new group id.)",
                self.group, _ASSIGNMENT_WATCH_S, ", ".join(self.names.values()))

    async def next(self) -> Delivery | None:
        while not self.buffer:
            if self.error is not None:
                raise self.error
            if self.stopped:
                return None
            self.ready.clear()
            await self.ready.wait()
        return self.buffer.popleft()

    async def _fetch_loop(self) -> None:
        while not self.stopped:
            try:
                await self._poll_once()
            except _KAFKA_ERRORS as exc:
                if self.stopped:
                    break
                if isinstance(exc, KafkaError) and exc.retriable:
                    logger.warning("group %s: %r while polling; retrying", self.group, exc)
                    await asyncio.sleep(1.0)
                    continue
                self.error = _translate(exc, f"polling for group {self.group!r}",
                                        self.settings.servers)
                logger.error("%s", self.error)
                break
        self.ready.set()  # wakes next(), which reports the error or the end

    async def _poll_once(self) -> None:
        self._apply_backpressure()
        batch = await self.consumer.getmany(
            timeout_ms=_POLL_MS, max_records=max(1, self.prefetch - self.unsettled))
        for tp, records in batch.items():
            for record in records:
                self._take(tp, record)
        if batch:
            self.ready.set()

    def _take(self, tp: TopicPartition, record: Any) -> None:
        part = self.parts.get(tp)
        if part is None:
            part = self.parts[tp] = _Partition()
        part.add(record.offset)
        self.unsettled += 1
        self.buffer.append(_delivery(record, self.names.get(tp.topic, tp.topic), self, part))

    def _apply_backpressure(self) -> None:
        # Pausing rather than not polling keeps getmany (and with it the heartbeat and the
        # max_poll_interval clock) going: a full worker stays in the group. Every assigned
        # partition is paused, since any record fetched would exceed the bound.
        if self.stopped:
            return
        if self.unsettled >= self.prefetch:
            if not self.paused:
                self.consumer.pause(*self.consumer.assignment())
                self.paused = True
        elif self.paused:
            self.consumer.resume(*self.consumer.paused())
            self.paused = False

    def settle(self, token: _Token) -> bool:
        """Mark a record settled; False when it is not ours to commit any more (revoked, closed,
        settled already)."""
        part = token.partition
        if part is None or self.parts.get(token.tp) is not part or not part.settle(token.offset):
            return False
        self.unsettled -= 1
        self.settled.set()
        self._apply_backpressure()
        return True

    async def commit(self) -> None:
        """Commit every partition's settled prefix. Callers that arrive while a commit is in
        flight share the next one, so 200 concurrent acks cost a couple of requests, not 200."""
        self._commit_wanted = True
        async with self._commit_lock:
            if not self._commit_wanted:
                return  # a commit that started after our settle covered it
            self._commit_wanted = False
            due = {tp: p for tp, p in self.parts.items()
                   if p.commit_at is not None and p.commit_at != p.committed}
            if not due:
                return
            offsets = {tp: p.commit_at for tp, p in due.items()}
            try:
                async with asyncio.timeout(self.settings.request_timeout):
                    await self.consumer.commit(offsets)
            except (CommitFailedError, IllegalStateError) as exc:
                # The partition moved to another member meanwhile; it redelivers from the last
                # commit and the handler layer dedups by request id. Not the caller's failure.
                logger.warning("group %s: commit of %s skipped: %s", self.group, offsets, exc)
                return
            except TimeoutError as exc:
                raise TransportError(f"Kafka: committing offsets for group {self.group!r} timed "
                                     f"out; check the broker at {self.settings.servers}") from exc
            except _KAFKA_ERRORS as exc:
                raise _translate(exc, f"committing offsets for group {self.group!r}",
                                 self.settings.servers) from exc
            for tp, part in due.items():
                part.committed = offsets[tp]

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        if not revoked:
            return  # the first join revokes nothing
        self._purge(revoked)
        await self._await_settled(revoked, self.settings.revoke_grace)
        try:
            await self.commit()
        except TransportError as exc:
            logger.warning("%s", exc)
        left = 0
        for tp in revoked:
            part = self.parts.pop(tp, None)
            if part is not None:
                left += len(part.unsettled)
        self.unsettled -= left
        logger.info("group %s: partitions %s revoked; %d in-flight deliveries left unsettled "
                    "will be redelivered to the new owner", self.group, sorted(revoked), left)

    def _purge(self, revoked: set[TopicPartition]) -> None:
        # Records fetched but not yet handed out would be handed out again by the new owner:
        # drop them rather than run them twice. They are each partition's fetched tail.
        kept: deque[Delivery] = deque()
        first: dict[TopicPartition, int] = {}
        for delivery in self.buffer:
            token: _Token = delivery.token
            if token.tp in revoked:
                first.setdefault(token.tp, token.offset)
            else:
                kept.append(delivery)
        self.buffer = kept
        for tp, offset in first.items():
            self.unsettled -= self.parts[tp].forget_from(offset)

    async def _await_settled(self, tps: set[TopicPartition], grace: float) -> None:
        # Handlers that finish within the grace get their offsets committed before the new
        # owner reads from the last commit; longer ones are redelivered there (at-least-once).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while any(self.parts[tp].unsettled for tp in tps if tp in self.parts):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self.settled.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.settled.wait(), remaining)

    async def stop(self) -> None:
        """Idempotent, and finishes even if the caller is cancelled meanwhile."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    async def _stop(self) -> None:
        self.stopped = True
        self.ready.set()
        if self._watch is not None:
            self._watch.cancel()
        if self._fetcher is not None:
            self._fetcher.cancel()
            await asyncio.gather(self._fetcher, return_exceptions=True)
        try:
            await self.commit()
        except TransportError as exc:
            logger.warning("%s; settled deliveries after the last commit will be redelivered", exc)
        self.parts.clear()
        self.buffer.clear()
        await _quietly(self.consumer.stop(), f"leaving group {self.group!r}",
                       self.settings.request_timeout)


async def _quietly(step: Awaitable[Any], what: str, timeout: float) -> None:
    """Shutdown steps log their failures: a close must not raise over a broker that went away."""
    try:
        async with asyncio.timeout(timeout):
            await step
    except (TimeoutError, *_KAFKA_ERRORS) as exc:
        logger.warning("Kafka: %s failed during close: %r", what, exc)


class KafkaTransport(Transport):
    """Kafka (or any Kafka-protocol broker) through aiokafka. See the module docstring.

    ``bootstrap_servers``: ``"host:port"``, ``"h1:p1,h2:p2"`` or a list. ``partitions`` and
    ``replication_factor`` apply to the topics this transport creates. ``revoke_grace_ms``: how
    long a rebalance waits for in-flight deliveries of revoked partitions to be settled before
    committing and letting go (longer ones are redelivered to the new owner).
    """

    durable = True
    atomic_ack = False
    #: ``read_range`` positions are per-partition offsets (or times), not stream ids.
    position_kind = "offset"

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        partitions: int = 3,
        replication_factor: int = 1,
        connect_timeout: float = 10.0,
        request_timeout: float = 30.0,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 3_000,
        max_poll_interval_ms: int = 300_000,
        revoke_grace_ms: int = 3_000,
        fetch_max_wait_ms: int = 100,
        max_request_size: int = 1_048_576,
        client_id: str = "debatebus",
    ) -> None:
        hosts = [bootstrap_servers] if isinstance(bootstrap_servers, str) else bootstrap_servers
        servers = [h.strip() for entry in hosts for h in entry.split(",") if h.strip()]
        if not servers:
            raise ConfigError("KafkaTransport needs bootstrap servers, e.g. 'localhost:9092'")
        if partitions < 1 or replication_factor < 1:
            raise ConfigError("partitions and replication_factor must be at least 1")
        self.servers = ",".join(servers)
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.revoke_grace = revoke_grace_ms / 1000
        self.max_request_size = max_request_size
        self.client_id = client_id
        # Tansu answers a parked fetch only when fetch_max_wait_ms runs out, not when data
        # arrives (Kafka answers at once), so this bounds delivery latency there. 100 ms costs an
        # idle consumer ten cheap fetches a second on Kafka; lower it for latency on Tansu.
        self._fetch_options: dict[str, Any] = {"fetch_max_wait_ms": fetch_max_wait_ms}
        self._group_options: dict[str, Any] = {
            "session_timeout_ms": session_timeout_ms,
            "heartbeat_interval_ms": heartbeat_interval_ms,
            "max_poll_interval_ms": max_poll_interval_ms,
            # aiokafka defaults this to the session timeout; the revoke hook may take the grace.
            "rebalance_timeout_ms": session_timeout_ms + revoke_grace_ms,
        }
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._connect_lock = asyncio.Lock()
        self._ensure_lock = asyncio.Lock()
        self._known: set[str] = set()
        self._listed = False
        self._members: set[_Member] = set()
        self._readers: set[AIOKafkaConsumer] = set()

    # -- connections -----------------------------------------------------------------------

    async def connect(self) -> None:
        await self._ready()

    async def _ready(self) -> tuple[AIOKafkaProducer, AIOKafkaAdminClient]:
        """The producer and admin client, connecting them on first use."""
        if self._producer is None or self._admin is None:
            async with self._connect_lock:
                if self._producer is None or self._admin is None:
                    self._producer, self._admin = await self._connect()
        return self._producer, self._admin

    async def _connect(self) -> tuple[AIOKafkaProducer, AIOKafkaAdminClient]:
        timeout_ms = int(self.request_timeout * 1000)
        # No idempotence: Tansu lacks it; duplicates are handled by request id upstream.
        producer = AIOKafkaProducer(
            bootstrap_servers=self.servers, client_id=self.client_id, acks="all",
            enable_idempotence=False, max_request_size=self.max_request_size,
            request_timeout_ms=timeout_ms)
        await self._start(producer.start, producer.stop, "connecting the producer")
        admin = AIOKafkaAdminClient(bootstrap_servers=self.servers, client_id=self.client_id,
                                    request_timeout_ms=timeout_ms)
        try:
            await self._start(admin.start, admin.close, "connecting the admin client")
        except TransportError:
            await _quietly(producer.stop(), "stopping the producer", self.request_timeout)
            raise
        return producer, admin

    async def _start(self, start: Callable[[], Awaitable[Any]],
                     stop: Callable[[], Awaitable[Any]], what: str) -> None:
        """Start a client within ``connect_timeout``, stopping it again if that fails."""
        try:
            async with asyncio.timeout(self.connect_timeout):
                with _kafka_errors(what, self.servers):
                    await start()
        except TimeoutError as exc:
            await _quietly(stop(), what, self.request_timeout)
            raise TransportError(
                f"Kafka: {what} timed out after {self.connect_timeout:g}s; check that a broker "
                f"listens at {self.servers} and that the address it advertises is reachable "
                "from this host") from exc
        except TransportError:
            await _quietly(stop(), what, self.request_timeout)
            raise

    async def close(self) -> None:
        """Commit what is settled, leave the groups, flush and stop the producer."""
        await asyncio.gather(*(m.stop() for m in list(self._members)),
                             *(self._drop_reader(r) for r in list(self._readers)))
        producer, admin = self._producer, self._admin
        self._producer = self._admin = None
        self._known.clear()  # a broker restarted meanwhile may have lost them (Tansu's memory://)
        self._listed = False
        if producer is not None:
            await _quietly(producer.stop(), "flushing the producer", self.request_timeout)
        if admin is not None:
            await _quietly(admin.close(), "closing the admin client", self.request_timeout)

    # -- topics ----------------------------------------------------------------------------

    async def ensure_topics(self, topics: Sequence[str]) -> None:
        await self._ensure(_names(topics))

    async def _ensure(self, names: Iterable[str]) -> None:
        missing = set(names) - self._known
        if not missing:
            return
        _, admin = await self._ready()
        async with self._ensure_lock:
            if not self._listed:
                # Learn what exists first: creating an existing topic may be refused by ACLs
                # even where reading and writing it is allowed.
                with _kafka_errors("listing topics", self.servers):
                    self._known.update(await admin.list_topics())
                self._listed = True
            missing -= self._known
            if missing:
                await self._create(admin, sorted(missing))

    async def _create(self, admin: AIOKafkaAdminClient, names: list[str]) -> None:
        new = [NewTopic(n, self.partitions, self.replication_factor) for n in names]
        with _kafka_errors(f"creating topics {', '.join(names)}", self.servers):
            response = await admin.create_topics(new)
        refused = []
        for entry in response.topic_errors:  # (topic, error_code[, error_message])
            name, code = entry[0], entry[1]
            if code in (0, TopicAlreadyExistsError.errno):
                self._known.add(name)
            else:
                refused.append(f"{name}: {for_code(code).__name__} {entry[2:] or ''}")
        if refused:
            raise TransportError(
                f"Kafka refused to create topics ({'; '.join(refused)}): allow this client to "
                f"create topics, or create them with {self.partitions} partitions beforehand")

    async def _partitions_of(self, name: str) -> list[TopicPartition]:
        producer, _ = await self._ready()
        with _kafka_errors(f"reading the partitions of {name}", self.servers):
            numbers = await producer.partitions_for(name)
        return [TopicPartition(name, p) for p in sorted(numbers)]

    # -- producing -------------------------------------------------------------------------

    async def _send(self, records: Sequence[_Record]) -> list[Any]:
        """Produce and wait for the broker's acknowledgement of every record."""
        if not records:
            return []
        producer, _ = await self._ready()
        await self._ensure({r.topic for r in records})
        topics = ", ".join(sorted({r.topic for r in records}))
        with _kafka_errors(f"producing to {topics}", self.servers):
            # send() only appends to the batch; awaiting them together lets them share requests.
            futures = [await producer.send(r.topic, r.value, key=r.key, headers=list(r.headers))
                       for r in records]
            return list(await asyncio.gather(*futures))

    async def publish(self, message: Outgoing) -> str:
        (meta,) = await self._send([_outgoing(message)])
        return f"{meta.partition}:{meta.offset}"

    # -- settling --------------------------------------------------------------------------

    async def ack(self, delivery: Delivery, results: Sequence[Outgoing] = ()) -> None:
        """Produce ``results``, then mark the delivery settled and commit the settled prefix.
        Not atomic: a crash in between redelivers the request (the handler layer dedups)."""
        token = _token_of(delivery)
        await self._send([_outgoing(m) for m in results])
        await self._settle(token)

    async def reject(self, delivery: Delivery, reason: str, *, requeue: bool = False) -> None:
        """``requeue``: Kafka cannot redeliver one record, so append a copy to the same topic
        with the delivery count raised. Otherwise copy it to ``{topic}:dlq`` with the reason."""
        token = _token_of(delivery)
        copy = _requeued(delivery, token) if requeue else _dead_letter(delivery, token, reason)
        await self._send([copy])
        await self._settle(token)

    async def _settle(self, token: _Token) -> None:
        member = token.member
        if member is not None and member.settle(token):
            await member.commit()

    # -- consuming -------------------------------------------------------------------------

    async def consume(
        self, topics: Sequence[str], *, group: str, consumer: str, prefetch: int = 16
    ) -> AsyncIterator[Delivery]:
        if prefetch < 1:
            raise ConfigError(f"prefetch must be at least 1, not {prefetch}")
        names = _names(topics)
        await self._ensure(names)
        kafka_consumer = AIOKafkaConsumer(
            bootstrap_servers=self.servers, client_id=f"{self.client_id}-{consumer}",
            group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
            max_poll_records=prefetch, **self._group_options, **self._fetch_options)
        await self._start(kafka_consumer.start, kafka_consumer.stop, f"joining group {group!r}")
        member = _Member(kafka_consumer, names, group, prefetch, self)
        self._members.add(member)
        try:
            member.start()
            while (delivery := await member.next()) is not None:
                yield delivery
        finally:
            try:
                await member.stop()
            finally:
                self._members.discard(member)

    async def _reader(self) -> AIOKafkaConsumer:
        """A group-less consumer: reads wherever it is told to, commits nothing."""
        reader = AIOKafkaConsumer(bootstrap_servers=self.servers, client_id=self.client_id,
                                  group_id=None, enable_auto_commit=False, **self._fetch_options)
        await self._start(reader.start, reader.stop, "starting a reader")
        self._readers.add(reader)
        return reader

    async def _drop_reader(self, reader: AIOKafkaConsumer) -> None:
        self._readers.discard(reader)
        await _quietly(reader.stop(), "stopping a reader", self.request_timeout)

    async def _poll(self, reader: AIOKafkaConsumer, *tps: TopicPartition) -> list[Any] | None:
        """One getmany as a flat list of records; None once the reader was stopped by close()."""
        try:
            batch = await reader.getmany(*tps, timeout_ms=_POLL_MS)
        except ConsumerStoppedError:
            return None
        except _KAFKA_ERRORS as exc:
            raise _translate(exc, "reading", self.servers) from exc
        return [record for records in batch.values() for record in records]

    async def subscribe(self, topics: Sequence[str]) -> AsyncIterator[Delivery]:
        """A group-less reader positioned at the end of every partition of ``topics`` by the
        time this returns, so nothing published afterwards is missed."""
        names = _names(topics)
        await self._ensure(names)  # so there are partitions to position on right away
        reader = await self._reader()
        try:
            tps = [tp for name in names for tp in await self._partitions_of(name)]
            reader.assign(tps)
            with _kafka_errors("seeking to the end", self.servers):
                await reader.seek_to_end(*tps)
                for tp in tps:  # resolves any reset still pending: the position is fixed now
                    await reader.position(tp)
        except BaseException:
            await self._drop_reader(reader)
            raise
        return _Subscription(self, reader, names)

    # -- ops replay ------------------------------------------------------------------------

    async def read_range(
        self,
        topic: str,
        start: int | datetime | None = None,
        end: int | datetime | None = None,
        *,
        partitions: Sequence[int] | None = None,
    ) -> AsyncIterator[Delivery]:
        """Records of ``topic`` from ``start`` to ``end``, both inclusive, for ops replay.

        Integers are offsets, applied to every partition (restrict with ``partitions``);
        datetimes are record timestamps (naive ones are local time); None is open. Reads up to
        the end of each partition as it was when called, so a replay that re-publishes to the
        same topic ends. Partition by partition, not in global order. Nothing to settle.
        """
        name = kafka_topic(topic)
        await self._ensure_exists(name)
        reader = await self._reader()
        try:
            tps = await self._partitions_of(name)
            if partitions is not None:
                tps = [tp for tp in tps if tp.partition in set(partitions)]
            reader.assign(tps)
            bounds = await self._bounds(reader, tps, start, end)
            active = {tp for tp, (lo, hi) in bounds.items() if lo < hi}
            for tp in active:
                reader.seek(tp, bounds[tp][0])
            low, high = _millis(start, float("-inf")), _millis(end, float("inf"))
            while active:
                records = await self._poll(reader, *active)
                if records is None:
                    return
                for record in records:
                    tp = TopicPartition(record.topic, record.partition)
                    if tp in active and record.offset < bounds[tp][1] and \
                            low <= record.timestamp <= high:
                        yield _delivery(record, topic)
                active = {tp for tp in active if await reader.position(tp) < bounds[tp][1]}
        finally:
            await self._drop_reader(reader)

    async def _ensure_exists(self, name: str) -> None:
        _, admin = await self._ready()
        with _kafka_errors("listing topics", self.servers):
            self._known.update(await admin.list_topics())
        if name not in self._known:
            raise ConfigError(f"Kafka topic {name!r} does not exist: check the event type")

    async def _bounds(self, reader: AIOKafkaConsumer, tps: list[TopicPartition],
                      start: int | datetime | None, end: int | datetime | None,
                      ) -> dict[TopicPartition, tuple[int, int]]:
        """Per partition, the offsets [first, stop) to scan; ``end`` is inclusive."""
        with _kafka_errors("reading partition offsets", self.servers):
            begins = await reader.beginning_offsets(tps)
            ends = await reader.end_offsets(tps)
        if isinstance(start, datetime):
            at = int(_millis(start, 0))
            firsts = await self._time_starts(reader, tps, at, begins, ends)
        else:
            firsts = {tp: max(begins[tp], start or 0) for tp in tps}
        stops = {tp: min(ends[tp], end + 1) if isinstance(end, int) else ends[tp] for tp in tps}
        return {tp: (firsts[tp], stops[tp]) for tp in tps}

    async def _time_starts(self, reader: AIOKafkaConsumer, tps: list[TopicPartition], at: int,
                           begins: dict[TopicPartition, int], ends: dict[TopicPartition, int],
                           ) -> dict[TopicPartition, int]:
        """Where to start reading for records at or after ``at`` (ms), per partition.

        Uses the broker's time index (offsets_for_times) when it passes a check: Kafka answers
        the earliest offset with timestamp >= at, so the record before it must be older. Tansu's
        index ignores record timestamps (it answered offset 0 for any time, or a later offset
        than the first matching record), so a failed check falls back to the partition's
        beginning. Starting early is always safe: read_range filters by timestamp anyway.
        """
        with _kafka_errors("looking up offsets by time", self.servers):
            found = await reader.offsets_for_times({tp: at for tp in tps})
        starts = {}
        for tp in tps:
            hit = found.get(tp)
            offset = ends[tp] if hit is None else hit.offset
            if offset > begins[tp] and not await self._older_before(reader, tp, offset, at):
                logger.warning("Kafka: the broker's time index answered offset %d for %s, but an "
                               "earlier record is not older; scanning %s from its beginning",
                               offset, tp, tp)
                offset = begins[tp]
            starts[tp] = offset
        return starts

    async def _older_before(self, reader: AIOKafkaConsumer, tp: TopicPartition, offset: int,
                            at: int) -> bool:
        """Whether the record just before ``offset`` has a timestamp before ``at``."""
        reader.seek(tp, offset - 1)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout
        while loop.time() < deadline:
            records = await self._poll(reader, tp)
            if records:
                before = records[0]
                return bool(before.offset < offset and before.timestamp < at)
        return False


class _Subscription:
    """What ``subscribe`` returns: already positioned; ``aclose()`` (or the transport's
    ``close()``) stops its reader. A class, not a generator, so closing works before iterating."""

    def __init__(self, transport: KafkaTransport, reader: AIOKafkaConsumer,
                 names: dict[str, str]) -> None:
        self._transport = transport
        self._reader = reader
        self._names = names
        self._pending: deque[Delivery] = deque()

    def __aiter__(self) -> _Subscription:
        return self

    async def __anext__(self) -> Delivery:
        while not self._pending:
            records = await self._transport._poll(self._reader)
            if records is None:
                raise StopAsyncIteration
            self._pending.extend(_delivery(r, self._names[r.topic]) for r in records)
        return self._pending.popleft()

    async def aclose(self) -> None:
        await self._transport._drop_reader(self._reader)


def _requeued(delivery: Delivery, token: _Token) -> _Record:
    headers = [h for h in token.raw_headers if h[0] != DELIVERIES_HEADER]
    headers.append((DELIVERIES_HEADER, str(delivery.deliveries + 1).encode()))
    return _Record(token.tp.topic, delivery.body, token.raw_key, tuple(headers))


def _dead_letter(delivery: Delivery, token: _Token, reason: str) -> _Record:
    headers = [h for h in token.raw_headers if h[0] not in _DLQ_HEADERS]
    headers += [(REASON_HEADER, reason.encode()), (ORIGIN_HEADER, delivery.topic.encode()),
                (ORIGIN_PARTITION_HEADER, str(token.tp.partition).encode()),
                (ORIGIN_OFFSET_HEADER, str(token.offset).encode())]
    topic = kafka_topic(dlq_topic(delivery.topic))
    return _Record(topic, delivery.body, token.raw_key, tuple(headers))


def _millis(moment: int | datetime | None, unbounded: float) -> float:
    """A time bound in ms since the epoch; an offset or None puts no bound on time."""
    return moment.timestamp() * 1000 if isinstance(moment, datetime) else unbounded


def _token_of(delivery: Delivery) -> _Token:
    if not isinstance(delivery.token, _Token):
        raise ConfigError("this delivery did not come from a KafkaTransport: settle it with the "
                          "transport that delivered it")
    return delivery.token
