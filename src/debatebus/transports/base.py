"""The one transport interface. The worker sees only this; each broker is a small implementation.

Delivery model (the Redis Streams model, which every transport emulates as far as its broker can):
``consume`` yields messages for a consumer group; each message is settled exactly once with
``ack`` (optionally publishing results *atomically with* the ack where the broker allows it) or
``reject`` (back to the group for redelivery, or to the dead-letter topic ``{topic}:dlq``).
A message that is never settled — its consumer died — is redelivered to another consumer. While a
consumer lives, its transport keeps what it holds from being taken over (Redis Streams: its own
keep-alive; Kafka: the group heartbeat), until the delivery is settled or ``release``d.

Optional capabilities are methods of the interface too, so callers never probe for them:
``read_range`` (ops replay; raises ``NotSupportedError`` where the broker keeps no history, with
``position_kind`` saying how positions are written), ``write_heartbeat`` (where
``debatebus check`` finds a worker's heartbeat) and ``slot_lent`` (a delivery whose handler
waits on other requests stops counting toward ``prefetch``).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, Final, Literal, Self

from debatebus.exceptions import NotSupportedError
from debatebus.transports.dialect import DEBATEBUS_WIRE, WireDialect

__all__ = [
    "HEARTBEAT_STREAM_MAXLEN",
    "HEARTBEAT_TOPIC",
    "ORIGIN_HEADER",
    "REASON_HEADER",
    "Delivery",
    "Outgoing",
    "PositionKind",
    "Transport",
    "dlq_topic",
    "heartbeat_key",
]

#: A dead letter's header (Redis Streams: its ``reason`` field) saying why it was dead-lettered.
REASON_HEADER: Final = "x-debatebus-reason"
#: A dead letter's header (Redis Streams: its ``origin`` field) naming the topic it came from.
ORIGIN_HEADER: Final = "x-debatebus-origin"
#: Where workers' heartbeats go (a stream or topic; Redis pub/sub: ``heartbeat_key`` instead).
HEARTBEAT_TOPIC: Final = "debatebus:heartbeat"
#: About how many heartbeats the Redis stream keeps (approximate trimming).
HEARTBEAT_STREAM_MAXLEN: Final = 1000
#: How ``read_range`` takes positions: stream entry ids (``1700000000000-0``, ``-``/``+`` for the
#: open ends) or offsets (ints, or datetimes for record times; None for an open end).
PositionKind = Literal["entry-id", "offset"]


def dlq_topic(topic: str) -> str:
    return f"{topic}:dlq"


def heartbeat_key(group: str) -> str:
    """The Redis key holding a group's newest heartbeat (Redis pub/sub workers)."""
    return f"{HEARTBEAT_TOPIC}:{group}"


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
    ``token`` is private to the transport that produced the delivery.
    """

    topic: str
    body: bytes
    id: str
    deliveries: int = 1
    key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    token: Any = field(default=None, repr=False, compare=False)


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

    def read_range(self, topic: str, start: Any = None, end: Any = None) -> AsyncIterator[Delivery]:
        """The messages of ``topic`` from ``start`` to ``end`` (inclusive; None: open), oldest
        first, up to the end as it was when called, for ops replay; positions as
        ``position_kind`` says. Nothing to settle. Raises ``NotSupportedError`` where the broker
        keeps no history (Redis pub/sub)."""
        raise NotSupportedError(f"{type(self).__name__} keeps no history to read or replay: "
                                "replay works on Redis Streams and Kafka")

    async def write_heartbeat(self, group: str, consumer: str, beat: bytes, *,
                              interval_s: float, last: bool = False) -> None:
        """Store a worker heartbeat (JSON) where ``debatebus check`` reads it; ``last``: the
        worker is stopping. By default a message on ``HEARTBEAT_TOPIC`` keyed by ``group``
        (Kafka); Redis trims its stream or keeps a key instead. Raises ``NotSupportedError``
        where no other process could read it (memory)."""
        await self.publish(Outgoing(HEARTBEAT_TOPIC, beat, key=group))

    async def ensure_topics(self, topics: Sequence[str]) -> None:  # noqa: B027 - optional hook
        """Create topics/groups that must exist before consuming (Kafka); a no-op elsewhere."""
