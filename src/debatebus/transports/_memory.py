"""In-process transport with Redis Streams semantics: groups, pending entries, redelivery, DLQ.

For tests, the embedded demo and users' own tests. Transports built on the same ``MemoryBroker``
see the same topics, so a publisher, a worker and a listener can share one in a test.

As on Redis Streams, a transport keeps alive what it holds: an entry it was handed is never taken
over while the transport is open, until it is settled or released; a released entry (or one held
by a closed transport, i.e. a consumer that died) is handed out again ``claim_idle_s`` later.

Faults, for testing what a worker does when the broker misbehaves: ``MemoryBroker.inject`` makes
the next calls of one kind raise (``connect``, ``consume``, or ``settle`` — ``ack`` and ``reject``),
and ``MemoryBroker(max_message_bytes=…)`` refuses larger messages with ``MessageTooLargeError``
the way Kafka does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from debatebus.exceptions import MessageTooLargeError, NotSupportedError, TransportError
from debatebus.transports._base import (
    ORIGIN_HEADER,
    REASON_HEADER,
    Delivery,
    Outgoing,
    Transport,
    dlq_topic,
    refuse_partitions,
)

Fault = Literal["connect", "consume", "settle"]


@dataclass(slots=True, eq=False)
class _Pending:
    entry: int
    consumer: str
    deliveries: int
    #: The transport holding it, keeping it alive; None once released (or its holder closed),
    #: from ``since`` on.
    holder: MemoryTransport | None
    since: float

    def claimable(self, now: float, idle_s: float) -> bool:
        return self.holder is None and now - self.since >= idle_s


@dataclass(slots=True)
class _Group:
    cursor: int = 0
    pending: dict[int, _Pending] = field(default_factory=dict)
    requeued: deque[int] = field(default_factory=deque)


class MemoryBroker:
    """The shared state: append-only logs per topic and consumer-group bookkeeping."""

    def __init__(self, *, claim_idle_s: float = 30.0, max_message_bytes: int | None = None) -> None:
        self.logs: dict[str, list[Outgoing]] = {}
        self.groups: dict[tuple[str, str], _Group] = {}
        self.claim_idle_s = claim_idle_s
        self.max_message_bytes = max_message_bytes
        self._faults: dict[Fault, list[TransportError]] = {}
        # Plain futures rather than a Condition: the process-wide broker outlives event loops
        # (one per test), and a waiter only ever lives on the loop that is waiting.
        self._waiters: set[asyncio.Future[None]] = set()

    def log(self, topic: str) -> list[Outgoing]:
        return self.logs.setdefault(topic, [])

    def inject(self, fault: Fault, times: int = 1, error: TransportError | None = None) -> None:
        """Make the next ``times`` calls of one kind, on every transport of this broker, raise
        ``error`` (a ``TransportError`` naming the fault by default) instead of doing anything:
        ``connect``; ``consume`` (a running consumer raises at its next poll, within 50 ms, and
        each retry consumes one more fault); ``settle`` (``ack`` and ``reject``)."""
        error = error or TransportError(f"memory broker: injected {fault} failure")
        self._faults.setdefault(fault, []).extend([error] * times)

    def check(self, fault: Fault) -> None:
        """Raise the next injected error of this kind, if any (see ``inject``)."""
        pending = self._faults.get(fault)
        if pending:
            raise pending.pop(0)

    def check_size(self, messages: Sequence[Outgoing]) -> None:
        limit = self.max_message_bytes
        for message in messages:
            if limit is not None and len(message.body) > limit:
                raise MessageTooLargeError(
                    f"memory broker: message of {len(message.body)} bytes on {message.topic!r} is "
                    f"over max_message_bytes={limit}", size=len(message.body), limit=limit)

    async def append(self, messages: Sequence[Outgoing]) -> list[str]:
        self.check_size(messages)
        ids = []
        for message in messages:
            log = self.log(message.topic)
            log.append(message)
            ids.append(f"{len(log)}-0")
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        return ids

    async def wait(self, timeout: float) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, timeout)
        finally:
            self._waiters.discard(waiter)


_default: MemoryBroker | None = None


def default_broker() -> MemoryBroker:
    """The process-wide broker behind ``memory://`` URLs, made on first use."""
    global _default
    if _default is None:
        _default = MemoryBroker()
    return _default


class MemoryTransport(Transport):
    def __init__(self, broker: MemoryBroker | None = None) -> None:
        self.broker = broker or default_broker()
        self._closed = False

    async def connect(self) -> None:
        self.broker.check("connect")

    async def close(self) -> None:
        """What it holds is no longer kept alive: handed out again ``claim_idle_s`` from now."""
        self._closed = True
        now = time.monotonic()
        for group in self.broker.groups.values():
            for pending in group.pending.values():
                if pending.holder is self:
                    pending.holder, pending.since = None, now

    async def publish(self, message: Outgoing) -> str:
        return (await self.broker.append([message]))[0]

    def _next_for(self, topic: str, group_name: str, consumer: str) -> Delivery | None:
        group = self.broker.groups.setdefault((topic, group_name), _Group())
        now = time.monotonic()
        entry = group.requeued.popleft() if group.requeued else None
        if entry is None:
            entry = next(
                (p.entry for p in group.pending.values()
                 if p.claimable(now, self.broker.claim_idle_s)), None)
        if entry is None:
            log = self.broker.log(topic)
            if group.cursor >= len(log):
                return None
            entry = group.cursor
            group.cursor += 1
        previous = group.pending.get(entry)
        deliveries = previous.deliveries + 1 if previous else 1
        group.pending[entry] = _Pending(entry, consumer, deliveries, self, now)
        message = self.broker.log(topic)[entry]
        return Delivery(topic, message.body, f"{entry + 1}-0", deliveries, message.key,
                        dict(message.headers), token=(group_name, entry))

    async def consume(
        self, topics: Sequence[str], *, group: str, consumer: str, prefetch: int = 16
    ) -> AsyncIterator[Delivery]:
        while not self._closed:
            self.broker.check("consume")
            found = False
            for topic in topics:
                delivery = self._next_for(topic, group, consumer)
                if delivery is not None:
                    found = True
                    yield delivery
            if not found:
                await self.broker.wait(min(0.05, self.broker.claim_idle_s))

    def _pending(self, delivery: Delivery) -> _Pending | None:
        """The pending entry of ``delivery`` while this very delivery still holds it: a copy
        handed out again since (claimed, requeued) settles nothing."""
        group_name, entry = delivery.token
        pending = self.broker.groups[(delivery.topic, group_name)].pending.get(entry)
        return pending if pending is not None and pending.deliveries == delivery.deliveries else None

    def _settle(self, delivery: Delivery, results: Sequence[Outgoing]) -> bool:
        """Settle once: a retried ack or reject of a settled delivery is a no-op (False)."""
        self.broker.check("settle")
        if self._pending(delivery) is None:
            return False
        self.broker.check_size(results)
        group_name, entry = delivery.token
        del self.broker.groups[(delivery.topic, group_name)].pending[entry]
        return True

    def release(self, delivery: Delivery) -> None:
        """As on Redis Streams: the entry stays pending, is no longer kept alive, and is handed
        out again ``claim_idle_s`` from now."""
        pending = self._pending(delivery)
        if pending is not None and pending.holder is not None:
            pending.holder, pending.since = None, time.monotonic()

    async def ack(self, delivery: Delivery, results: Sequence[Outgoing] = ()) -> None:
        if self._settle(delivery, results):
            await self.broker.append(results)

    async def reject(self, delivery: Delivery, reason: str, *, requeue: bool = False) -> None:
        if requeue:
            self.broker.check("settle")
            group_name, entry = delivery.token
            if self._pending(delivery) is not None:
                self.broker.groups[(delivery.topic, group_name)].requeued.append(entry)
            return
        headers = {**delivery.headers, REASON_HEADER: reason, ORIGIN_HEADER: delivery.topic}
        dead = [Outgoing(dlq_topic(delivery.topic), delivery.body, delivery.key, headers)]
        if self._settle(delivery, ()):
            await self.broker.append(dead)

    async def write_heartbeat(self, group: str, consumer: str, beat: bytes, *,
                              interval_s: float, last: bool = False) -> None:
        """Not supported: no other process could read it."""
        raise NotSupportedError("memory:// lives inside one process: it keeps no heartbeats")

    async def read_range(self, topic: str, start: str = "-", end: str = "+", *,
                         partitions: Sequence[int] | None = None) -> AsyncIterator[Delivery]:
        """Entries between two ids (``N-0``, inclusive; ``-``/``+`` for the ends), oldest first,
        up to the end of the log as it was when called."""
        refuse_partitions(self, partitions)
        log = self.broker.log(topic)
        first = 0 if start == "-" else int(start.split("-")[0]) - 1
        last = len(log) if end == "+" else min(int(end.split("-")[0]), len(log))
        for index in range(max(first, 0), last):
            m = log[index]
            yield Delivery(topic, m.body, f"{index + 1}-0", 1, m.key, dict(m.headers))

    async def subscribe(self, topics: Sequence[str]) -> AsyncIterator[Delivery]:
        return self._follow(topics, {t: len(self.broker.log(t)) for t in topics})

    async def _follow(self, topics: Sequence[str], cursors: dict[str, int]) -> AsyncIterator[Delivery]:
        while not self._closed:
            found = False
            for topic in topics:
                log = self.broker.log(topic)
                for index in itertools.count(cursors[topic]):
                    if index >= len(log):
                        break
                    found = True
                    cursors[topic] = index + 1
                    m = log[index]
                    yield Delivery(topic, m.body, f"{index + 1}-0", 1, m.key, dict(m.headers))
            if not found:
                await self.broker.wait(0.05)
