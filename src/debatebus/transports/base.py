"""The one transport interface. The worker sees only this; each broker is a small implementation.

Delivery model (the Redis Streams model, which every transport emulates as far as its broker can):
``consume`` yields messages for a consumer group; each message is settled exactly once with
``ack`` (optionally publishing results *atomically with* the ack where the broker allows it) or
``reject`` (back to the group for redelivery, or to the dead-letter topic ``{topic}:dlq``).
A message that is never settled — its consumer died — is redelivered to another consumer.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

__all__ = ["Delivery", "Outgoing", "Transport", "dlq_topic"]


def dlq_topic(topic: str) -> str:
    return f"{topic}:dlq"


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
    """Publish, consume, settle. Backend errors surface as ``debatebus.TransportError``."""

    #: Whether settled messages survive a restart and unsettled ones are redelivered.
    durable: bool = True
    #: Whether ``ack`` publishes its results and acknowledges in one atomic step.
    atomic_ack: bool = False

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
        """Publish ``results`` and acknowledge ``delivery`` (atomically when ``atomic_ack``)."""

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

    async def touch(self, deliveries: Sequence[Delivery]) -> None:  # noqa: B027 - optional hook
        """Tell the broker these deliveries are still being worked on, so a long debate is not
        reclaimed from a live worker (Streams: reset their idle time). A no-op where the broker
        tracks liveness itself (Kafka heartbeats)."""

    async def ensure_topics(self, topics: Sequence[str]) -> None:  # noqa: B027 - optional hook
        """Create topics/groups that must exist before consuming (Kafka); a no-op elsewhere."""
