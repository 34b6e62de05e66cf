"""The consumer-group side of ``KafkaTransport``: one ``_Member`` per ``consume()`` call.

Liveness: a background task keeps calling ``getmany`` whatever the handlers are doing; when
``prefetch`` records are unsettled it pauses the assigned partitions instead of not polling. So
the consumer keeps heartbeating and its ``max_poll_interval_ms`` clock (which aiokafka measures
between ``getmany`` calls, not between messages) never runs out, however long a debate takes:
the default 300 000 ms is fine and only bounds a wedged event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from debatebus.exceptions import TransportError
from debatebus.transports.base import Delivery
from debatebus.transports.kafka_errors import _KAFKA_ERRORS, _quietly, _translate
from debatebus.transports.kafka_wire import _delivery, _Token

if TYPE_CHECKING:  # kafka imports this module, so importing it back must wait for types
    from debatebus.transports.kafka import KafkaTransport

# The transport's modules share one logger, so operators filter on one name whichever logs.
logger = logging.getLogger("debatebus.transports.kafka")

_POLL_MS: Final = 200  # how long one getmany waits when idle; bounds the fetch loop's reaction time
_ASSIGNMENT_WATCH_S: Final = 60


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
