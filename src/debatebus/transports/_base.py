"""The one transport interface. The worker sees only this; each broker is a small implementation.

Delivery model (the Redis Streams model, which every transport emulates as far as its broker can):
``consume`` yields messages for a consumer group; each message is settled one way with
``ack`` (optionally publishing results *atomically with* the ack where the broker allows it) or
``reject`` (back to the group for redelivery, or to the dead-letter topic ``{topic}:dlq``). A
settle may be repeated (the settler retries one that failed): on Redis Streams and memory a
repeat publishes nothing new; on Kafka and pub/sub it may publish the results again, with the
same bytes (and so the same ``messageId``).
A message that is never settled — its consumer died — is redelivered to another consumer. While a
consumer lives, its transport keeps what it holds from being taken over (Redis Streams: its own
keep-alive; Kafka: the group heartbeat), until the delivery is settled or ``release``d.

Optional capabilities are methods of the interface too, so callers never probe for them:
``read_range`` (ops replay and failure listings; raises ``NotSupportedError`` where the broker keeps no
history, with ``position_kind`` saying how positions are written), ``write_heartbeat`` (where
``debatebus check`` finds a worker's heartbeat) and ``slot_lent`` (a delivery whose handler
waits on other requests stops counting toward ``prefetch``).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, ClassVar, Final, Literal, Self

from debatebus.exceptions import ConfigError, NotSupportedError
from debatebus.transports._dialect import DEBATEBUS_WIRE, WireDialect

#: A dead letter's header (Redis Streams: its ``reason`` field) saying why it was dead-lettered.
REASON_HEADER: Final = "x-debatebus-reason"
#: On a result or dead letter published although its request had vanished from the broker before
#: it was settled (Redis restarted without its data, or the entry trimmed while it ran): the
#: request cannot be acknowledged, nobody else can answer it, so its answer goes out marked.
RECOVERED_HEADER: Final = "x-debatebus-recovered"
#: A dead letter's header (Redis Streams: its ``origin`` field) naming the topic it came from.
ORIGIN_HEADER: Final = "x-debatebus-origin"
#: Where in its origin a dead letter was: the entry id (Redis Streams: its ``originId`` field)...
ORIGIN_ID_HEADER: Final = "x-debatebus-origin-id"
#: ...or the partition and offset (Kafka).
ORIGIN_PARTITION_HEADER: Final = "x-debatebus-origin-partition"
ORIGIN_OFFSET_HEADER: Final = "x-debatebus-origin-offset"
#: How many times a dead letter had been delivered (Redis Streams: its ``deliveries`` field).
#: Never trusted as a count: Kafka drops it from consumed records.
DELIVERIES_HEADER: Final = "x-debatebus-deliveries"
#: Shared by every delivery without headers: one less dict per message.
NO_HEADERS: Mapping[str, str] = MappingProxyType({})
#: Every header dead-lettering adds to a message; ``request_headers`` takes them off again.
DEAD_LETTER_HEADERS: Final = frozenset({REASON_HEADER, ORIGIN_HEADER, ORIGIN_ID_HEADER,
                                        ORIGIN_PARTITION_HEADER, ORIGIN_OFFSET_HEADER,
                                        DELIVERIES_HEADER})
#: Where workers' heartbeats go (a stream or topic; Redis pub/sub: ``heartbeat_key`` instead).
HEARTBEAT_TOPIC: Final = "debatebus:heartbeat"
#: About how many heartbeats the Redis stream keeps (approximate trimming).
HEARTBEAT_STREAM_MAXLEN: Final = 1000
#: How ``read_range`` takes positions: stream entry ids (``1700000000000-0``, ``-``/``+`` for the
#: open ends) or offsets (ints, or datetimes for record times; None for an open end).
PositionKind = Literal["entry-id", "offset"]


def dlq_topic(topic: str) -> str:
    return f"{topic}:dlq"


def dead_letter_origin(delivery: Delivery) -> str | None:
    """The topic a dead letter came from (its ``ORIGIN_HEADER``); None for any other message."""
    return delivery.headers.get(ORIGIN_HEADER) or None


def request_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A dead letter's headers without those dead-lettering added: the request's own, to publish
    it again."""
    return {name: value for name, value in headers.items() if name not in DEAD_LETTER_HEADERS}


def refuse_partitions(transport: Transport, partitions: Sequence[int] | None) -> None:
    """``read_range`` on a broker without partitions: ``ConfigError`` when some were chosen."""
    if partitions is not None:
        raise ConfigError(f"{type(transport).__name__} has no partitions to choose from: "
                          "partitions are Kafka's")


def heartbeat_key(group: str, consumer: str | None = None) -> str:
    """The Redis key holding a group's newest heartbeat, or one consumer's newest (Redis pub/sub
    workers)."""
    key = f"{HEARTBEAT_TOPIC}:{group}"
    return key if consumer is None else f"{key}:consumer:{consumer}"


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message to publish: an event type (topic), the encoded body, an optional key/headers."""

    topic: str
    body: bytes
    key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Delivery:
    """One delivery of a message to this consumer.

    ``id`` is the broker's position (stream entry id, ``partition:offset``…); ``deliveries`` counts
    how many times the message has been handed out (1 the first time) where the broker tracks it.
    timestamp_ms: int | None = field(default=None, kw_only=True)
    malformed: str | None = field(default=None, kw_only=True)
    """

    topic: str
    body: bytes
    id: str
    deliveries: int = 1
    key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    token: Any = field(default=None, repr=False, compare=False)
    timestamp_ms: int | None = field(default=None, kw_only=True)
    malformed: str | None = field(default=None, kw_only=True)


class Transport(abc.ABC):
    """Publish, consume, settle. Backend errors surface as ``debatebus.exceptions.TransportError``."""

    #: How this transport's ``read_range`` takes positions.
    position_kind: ClassVar[PositionKind] = "entry-id"

    @property
    def dialect(self) -> WireDialect:
        """The rules its peers expect requests settled by: debatebus's own, unless the
        transport declares another (Redis pub/sub: Synkro's). See ``transports.dialect``."""
        return DEBATEBUS_WIRE

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def connect(self) -> None:  # noqa: B027 - optional hook
        """Open connections; idempotent. ``async with`` calls it."""

    def topic_name(self, topic: str) -> str:
        """The broker's own name for ``topic``, for log lines: the topic itself, unless the
        transport renames it (Kafka: ``debate.request.dlq``; a Redis Cluster: a hash tag)."""
        return topic

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections. Unsettled deliveries stay with the broker for redelivery."""

    @abc.abstractmethod
    async def publish(self, message: Outgoing) -> str:
        """Publish one message; returns the broker's id for it (or ``""`` where there is none)."""

    @abc.abstractmethod
    def consume(
        self, topics: Sequence[str], *, group: str, consumer: str, prefetch: int = 16
    ) -> AsyncIterator[Delivery]:
        """Deliveries for ``group``, shared with the group's other consumers; runs until closed."""

    @abc.abstractmethod
    async def ack(self, delivery: Delivery, results: Sequence[Outgoing] = ()) -> None:
        """Publish ``results`` and acknowledge ``delivery`` (in one atomic step where the broker
        allows it: Redis Streams, memory)."""

    @abc.abstractmethod
    async def reject(self, delivery: Delivery, reason: str, *, requeue: bool = False) -> None:
        """Give a delivery back for redelivery (``requeue``) or move it to ``{topic}:dlq`` with
        ``reason`` in its ``x-debatebus-reason`` header / field, original bytes untouched."""

    @abc.abstractmethod
    async def subscribe(self, topics: Sequence[str]) -> AsyncIterator[Delivery]:
        """Every message published on ``topics`` after this call returns, outside any group; no
        settling. Awaiting it establishes the position (so a request published next cannot slip
        past its listener); iterating yields messages; ``aclose()`` on the iterator stops it."""

    def release(self, delivery: Delivery) -> None:  # noqa: B027 - optional hook
        """Stop holding ``delivery`` without settling it, so the broker hands it out again: for a
        delivery whose settle kept failing, or whose debate lease was lost. Streams: stop keeping
        it alive, so it is claimed after ``claim_idle_ms``; Kafka: hand it out again from the
        same consumer (the partition is not blocked). Never raises."""

    def slot_lent(self, delivery: Delivery, lent: bool) -> None:  # noqa: B027 - optional hook
        """``delivery``'s handler lent its worker slot out to wait on other requests (``lent``: a
        parent waiting for its sub-debates), or took it back. While lent, the delivery does not
        count toward the ``prefetch`` a transport holds at most for the worker, so the requests
        it waits for can be read by the same worker. Kafka: the record stays unsettled (and
        uncommitted) but no longer keeps the group member paused; elsewhere nothing to do (Redis
        reads whenever the worker asks, which it does once a slot is free). Never raises."""

    def read_range(self, topic: str, start: Any = None, end: Any = None, *,
                   partitions: Sequence[int] | None = None) -> AsyncIterator[Delivery]:
        """The messages of ``topic`` from ``start`` to ``end`` (inclusive; None: open), oldest
        first, up to the end as it was when called, for ops replay and failure listings;
        positions as ``position_kind`` says; nothing for a topic that does not exist. Nothing to
        settle. ``partitions``: only those (Kafka; ``ConfigError`` on a broker without
        partitions). Raises ``NotSupportedError`` where the broker keeps no history (Redis
        pub/sub)."""
        raise NotSupportedError(f"{type(self).__name__} keeps no history to read: replay and "
                                "failures work on Redis Streams and Kafka")

    async def write_heartbeat(self, group: str, consumer: str, beat: bytes, *,
                              interval_s: float, last: bool = False) -> None:
        """Store a worker heartbeat (JSON) where ``debatebus check`` reads it; ``last``: the
        worker is stopping. By default a message on ``HEARTBEAT_TOPIC`` keyed by ``group``
        (Kafka); Redis trims its stream or keeps a key instead. Raises ``NotSupportedError``
        where no other process could read it (memory)."""
        await self.publish(Outgoing(HEARTBEAT_TOPIC, beat, key=group))

    async def ensure_topics(self, topics: Sequence[str]) -> None:  # noqa: B027 - optional hook
        """Create topics/groups that must exist before consuming (Kafka); a no-op elsewhere."""
