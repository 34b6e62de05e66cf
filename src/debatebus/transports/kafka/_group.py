"""The consumer-group side of ``KafkaTransport``: one ``Member`` per group a transport
consumes, which a later ``consume()`` call with the same group and topics takes over.

Liveness: a background task keeps calling ``getmany`` whatever the handlers are doing; when
``prefetch`` records are unsettled it pauses the assigned partitions instead of not polling. So
the consumer keeps heartbeating and its ``max_poll_interval_ms`` clock (which aiokafka measures
between ``getmany`` calls, not between messages) never runs out, however long a debate takes:
the default 300 000 ms is fine and only bounds a wedged event loop. The loop handles Kafka's errors
itself; anything else is logged and the loop runs again (``debatebus._supervisor``), and if it
keeps failing, ``next()`` raises a ``DebatebusError`` (no ``TransportError``), which stops the
worker instead of leaving it consuming nothing.

Lent slots: a record whose handler lent its worker slot out to wait on other requests (a parent
waiting for its sub-debates, ``Transport.slot_lent``) stays unsettled but does not count toward
``prefetch`` until the slot is taken back. Otherwise a worker whose every slot waited on a child
paused every partition, and the children it waited for were never fetched: at concurrency 1 a
parent waited out its whole sub-debate deadline before its child ran.

Shutdown: closing the ``consume()`` iterator only detaches it. The member pauses every partition
but stays in the group with its bookkeeping, so deliveries still in flight (a worker draining)
commit when they are settled. ``stop()`` (the transport's ``close()``) commits the settled
prefixes and leaves the group; what is unsettled then goes to the partitions' next owner.

Redelivery: a released (or requeued) delivery goes back into this member's buffer and is handed
out again with its count raised; its offset stays uncommitted until it is settled, and the rest
of the partition flows meanwhile. Counts live in the member, so a new owner starts at 1.

Turns: aiokafka's producer writes from a task of its own, which runs only when the handlers let
the event loop go. A fetched batch handed out all at once to handlers that never wait (instant
models, replays) ran whole before the first of its results was written, so the worker and its
clients took turns idling in lockstep. The member lets the loop go after every ``HANDOUT_BURST``
deliveries: results leave while the rest of the batch is handled, and each write still carries
several.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from debatebus._backoff import Backoff
from debatebus._loops import retrieved
from debatebus._redaction import redact
from debatebus._supervisor import supervise
from debatebus.exceptions import DebatebusError, TransportError
from debatebus.transports._base import Delivery
from debatebus.transports.kafka._errors import (
    KAFKA_ERRORS,
    kafka_errors,
    logger,
    quietly,
    translate,
)
from debatebus.transports.kafka._offsets import Mark, Partition
from debatebus.transports.kafka._settings import POLL_MS, KafkaSettings
from debatebus.transports.kafka._wire import Token, to_delivery

_ASSIGNMENT_WATCH_S: Final = 60
#: Deliveries handed out between two turns of the event loop (see "Turns" above). Each turn
#: costs a loop pass; fewer turns batch writes better, more let results out sooner. Measured
#: (benchmarks/bus.py, instant debates, docs/benchmarks.md stop 24): with 8 the worker is busy
#: 95–99% of the time at ~5% more CPU per request than whole batches; 1 costs ~15% more; 16
#: sometimes leaves the lockstep in place.
HANDOUT_BURST: Final = 8

#: The transport's: forget which topics exist and ensure these (by Kafka name) again.
Recheck = Callable[[Iterable[str]], Awaitable[None]]
#: The transport's: what the record at an offset of a partition holds now (None: no record).
MarkAt = Callable[[TopicPartition, int], Awaitable[Mark | None]]


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka has no type hints
    def __init__(self, member: Member) -> None:
        self.member = member

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self.member.on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self.member.paused = False  # a new assignment starts unpaused
        self.member.apply_backpressure()  # before a fetch, if the member is full or detached
        logger.debug("group %s: assigned %s", self.member.group, sorted(assigned))
        await self.member.after_assignment(set(assigned))


class Member:
    """A group consumer, its fetch loop and its commit bookkeeping; see the module docstring."""

    def __init__(self, consumer: AIOKafkaConsumer, names: dict[str, str], group: str,
                 prefetch: int, settings: KafkaSettings, *, recheck: Recheck,
                 mark_at: MarkAt) -> None:
        self.consumer = consumer
        self.names = names
        self.group = group
        self.prefetch = prefetch
        self.settings = settings
        self._recheck = recheck
        self._mark_at = mark_at
        self.parts: dict[TopicPartition, Partition] = {}
        self.buffer: deque[Delivery] = deque()
        self.unsettled = 0  # fetched (buffered or handed out) and not yet settled; some lent
        self.handed_out = 0  # deliveries handed out, for HANDOUT_BURST
        self.ready = asyncio.Event()
        self.settled = asyncio.Event()
        #: What ``next()`` raises: a ``TransportError`` the worker waits out like an outage (it
        #: consumes again, which restarts fetching), or the fetch loop given up (it stops).
        self.error: DebatebusError | None = None
        self.attached = False  # a consume() iterator is taking deliveries
        self.checking = False  # a new assignment's committed offsets are being checked
        self.stopped = False
        self.paused = False
        self._fetcher: asyncio.Task[None] | None = None
        self._retry = Backoff()  # between polls that failed with a retriable Kafka error
        self._watch: asyncio.TimerHandle | None = None
        self._stopping: asyncio.Future[None] | None = None
        self._commit_lock = asyncio.Lock()
        self._next_commit: asyncio.Future[None] | None = None  # the commit acks wait for
        # What this member last committed per partition, across assignments: see
        # _rewind_lost_logs.
        self.commits: dict[TopicPartition, tuple[int, Mark | None]] = {}

    def start(self) -> None:
        self.consumer.subscribe(list(self.names), listener=_Listener(self))
        self._watch = asyncio.get_running_loop().call_later(_ASSIGNMENT_WATCH_S,
                                                            self._warn_if_unassigned)
        self.attach()

    def attach(self) -> None:
        """A ``consume()`` iterator takes deliveries (again): resume, and restart fetching if an
        error had stopped it."""
        self.attached = True
        self.error = None
        if self._fetcher is None or self._fetcher.done():
            self._fetcher = asyncio.create_task(
                supervise(f"the Kafka fetch loop of group {self.group!r}", self._fetch_loop,
                          log=logger, died=self._fetching_died, backoff=Backoff()),
                name=f"kafka-fetch-{self.group}")
        self.apply_backpressure()

    def detach(self) -> None:
        """The iterator closed: fetch nothing more, keep the membership and the bookkeeping."""
        self.attached = False
        self.apply_backpressure()

    async def after_assignment(self, assigned: set[TopicPartition]) -> None:
        """Undo what a broker that restarted without its data (Tansu's ``memory://``) leaves
        behind; it makes the group rejoin, so this runs on each assignment. Its topics are gone:
        create them again before anything is produced to them. Its new logs have other records
        at the old offsets, and it takes commits from members it no longer knows: when an offset
        this member committed no longer follows the record it followed then, read every
        assigned partition from the start, or new records below those offsets would be skipped.
        Costs a topic listing per assignment, and a look at one record per partition this
        member had committed on."""
        self.checking = True  # nothing is fetched from the committed offsets until checked
        self.apply_backpressure()
        try:
            await self._recheck(self.names)
            await self._rewind_lost_logs(assigned)
        except TransportError as exc:
            logger.warning("group %s: %s", self.group, exc)
        finally:
            self.checking = False
            self.apply_backpressure()

    async def _rewind_lost_logs(self, assigned: set[TopicPartition]) -> None:
        ours = {tp: self.commits[tp] for tp in assigned if tp in self.commits}
        if not ours:
            return
        with kafka_errors(f"checking the offsets of group {self.group!r}",
                           self.settings.servers):
            if await self._lost_any(ours):
                # The broker lost its offsets too: whatever it holds was committed after the
                # restart by members it no longer knew. Read every partition from the start.
                logger.warning("group %s: the broker no longer holds the records behind the "
                               "offsets this consumer committed (it restarted without its "
                               "data): reading %s from the start", self.group,
                               ", ".join(str(tp) for tp in sorted(assigned)))
                await self.consumer.seek_to_beginning(*assigned)

    async def _lost_any(self, ours: dict[TopicPartition, tuple[int, Mark | None]]) -> bool:
        """Whether a partition's committed offset, committed by this member, no longer follows
        the record it followed then."""
        ends = await self.consumer.end_offsets(list(ours))
        for tp, (offset, mark) in sorted(ours.items()):
            if await self.consumer.committed(tp) != offset or mark is None:
                continue  # committed by another member since: not ours to check
            if offset > ends[tp] or await self._mark_at(tp, offset - 1) != mark:
                return True
        return False

    def _warn_if_unassigned(self) -> None:
        # A member that never gets partitions just waits, silently; say so once.
        if not self.stopped and not self.consumer.assignment():
            logger.warning(
                "group %s: no partitions assigned after %ds. Normal if the group has more members "
                "than %s have partitions; otherwise check the broker. (Tansu 0.6 strands a group "
                "whose leader was the last member to leave: restart it or use a new group id.)",
                self.group, _ASSIGNMENT_WATCH_S, ", ".join(self.names.values()))

    async def next(self) -> Delivery | None:
        self.handed_out += 1
        if self.handed_out % HANDOUT_BURST == 0:
            await asyncio.sleep(0)  # the event loop's turn: see "Turns" in the module docstring
        while True:
            while not self.buffer:
                if self.error is not None:
                    raise self.error
                if self.stopped:
                    return None
                self.ready.clear()
                await self.ready.wait()
            delivery = self.buffer.popleft()
            token: Token = delivery.token
            part = self._current(token)  # None: revoked or reset meanwhile, so skipped
            count = part.hand_out(token.offset) if part is not None else 0
            if count:
                return delivery if count == delivery.deliveries else replace(delivery,
                                                                             deliveries=count)

    async def _fetch_loop(self) -> None:
        """Poll until stopped. Kafka's errors are handled here (a retriable one is retried with
        backoff, another ends the loop as ``self.error``); anything else is ``supervise``'s."""
        while not self.stopped:
            try:
                await self._poll_once()
            except KAFKA_ERRORS as exc:
                if self.stopped:
                    break
                if isinstance(exc, KafkaError) and exc.retriable:
                    logger.warning("group %s: %r while polling; retrying", self.group, exc)
                    await asyncio.sleep(self._retry.next())
                    continue
                self.error = translate(exc, f"polling for group {self.group!r}",
                                        self.settings.servers)
                logger.error("%s", self.error)
                break
            self._retry.reset()
        self.ready.set()  # wakes next(), which reports the error or the end

    def _fetching_died(self, exc: Exception) -> None:
        """The fetch loop kept failing on an error nobody expected: ``next()`` raises, and the
        worker stops (not a ``TransportError``: consuming again would not get past it)."""
        self.error = DebatebusError(
            f"Kafka: the fetch loop of group {self.group!r} stopped: {redact(repr(exc))}; nothing "
            "more is consumed (the error is logged with its traceback)")
        self.ready.set()

    async def _poll_once(self) -> None:
        self.apply_backpressure()
        batch = await self.consumer.getmany(
            timeout_ms=POLL_MS, max_records=max(1, self.prefetch - self._holding()))
        for tp, records in batch.items():
            for record in records:
                self._take(tp, record)
        if batch:
            self.ready.set()

    def _take(self, tp: TopicPartition, record: Any) -> None:
        part = self.parts.get(tp)
        if part is not None and record.offset <= part.last:
            # Kafka never hands out an offset twice unasked: the consumer reset its position.
            self._lost(tp, f"starts over at offset {record.offset} after {part.last}")
            part = None
        if part is None:
            part = self.parts[tp] = Partition()
        part.add(record.offset, Mark(record.timestamp, record.key))
        self.unsettled += 1
        self.buffer.append(to_delivery(record, self.names.get(tp.topic, tp.topic), self, part))

    def _lost(self, tp: TopicPartition, what: str) -> None:
        """Forget a partition whose log the broker lost (a memory-only broker restarted): its
        deliveries in flight will never commit, and its new records start a new bookkeeping."""
        part = self.parts.pop(tp)
        logger.warning("group %s: %s %s: the broker lost its records; %d deliveries in flight "
                       "there will not be committed", self.group, tp, what, len(part.unsettled))
        self.unsettled -= len(part.unsettled)

    def apply_backpressure(self) -> None:
        # Pausing rather than not polling keeps getmany (and with it the heartbeat and the
        # max_poll_interval clock) going: a full or detached member stays in the group. Every
        # assigned partition is paused, since any record fetched would exceed the bound.
        if self.stopped:
            return
        full = self.unsettled >= self.prefetch and self._holding() >= self.prefetch
        if not self.attached or self.checking or full:
            if not self.paused:
                self.consumer.pause(*self.consumer.assignment())
                self.paused = True
        elif self.paused:
            self.consumer.resume(*self.consumer.paused())
            self.paused = False

    def _holding(self) -> int:
        """The unsettled records that count toward ``prefetch``: all but those whose handler
        lent its slot out (see "Lent slots" in the module docstring)."""
        return self.unsettled - sum(len(part.lent) for part in self.parts.values())

    def lend(self, token: Token, lent: bool) -> None:
        """The record's handler lent its slot out (``lent``) or took it back."""
        part = self._current(token)
        if part is not None and part.lend(token.offset, lent):
            self.apply_backpressure()

    def _current(self, token: Token) -> Partition | None:
        """The token's partition bookkeeping if this member still owns that assignment."""
        part = token.partition
        return part if part is not None and self.parts.get(token.tp) is part else None

    def settle(self, token: Token) -> bool:
        """Mark a record settled; False when it is not ours to commit any more (revoked, closed,
        settled already)."""
        part = self._current(token)
        if part is None or not part.settle(token.offset):
            return False
        self.unsettled -= 1
        self.settled.set()
        self.apply_backpressure()
        return True

    def is_settled(self, token: Token) -> bool:
        """Whether this member settled the record already (an ack being retried)."""
        part = self._current(token)
        return part is not None and token.offset not in part.unsettled

    def release(self, delivery: Delivery) -> None:
        """Hand an unsettled delivery out again (first in line), counting one more delivery."""
        token: Token = delivery.token
        part = self._current(token)
        if part is not None and not self.stopped and part.put_back(token.offset):
            self.buffer.appendleft(delivery)
            self.ready.set()

    async def commit(self) -> None:
        """Commit every partition's settled prefix. One commit is in flight at a time; callers
        meanwhile share the next, which starts as soon as it lands: a burst of 200 acks costs a
        commit or two, not 200, and no ack waits for a timer. Returns once a commit that started
        after this call landed; raises what it raised."""
        if self._next_commit is None:
            self._next_commit = asyncio.ensure_future(self._commit_next())
            self._next_commit.add_done_callback(retrieved)
        await asyncio.shield(self._next_commit)

    async def _commit_next(self) -> None:
        async with self._commit_lock:
            # Settles from here on wait for the next commit: this one may miss them.
            self._next_commit = None
            await self._commit_now()

    async def _commit_now(self) -> None:
        due = {tp: p for tp, p in self.parts.items()
               if p.commit_at is not None and p.commit_at != p.committed}
        if not due:
            return
        offsets = {tp: p.commit_at for tp, p in due.items() if p.commit_at is not None}
        try:
            async with asyncio.timeout(self.settings.request_timeout):
                await self.consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as exc:
            # The partition moved to another member meanwhile; it redelivers from the last
            # commit (what keeps that from running a debate twice: see ``transport``). Not
            # the caller's failure.
            logger.warning("group %s: commit of %s skipped: %s", self.group, offsets, exc)
            return
        except TimeoutError as exc:
            raise TransportError(f"Kafka: committing offsets for group {self.group!r} timed "
                                 f"out; check the broker at {self.settings.servers}") from exc
        except KAFKA_ERRORS as exc:
            raise translate(exc, f"committing offsets for group {self.group!r}",
                             self.settings.servers) from exc
        for tp, part in due.items():
            part.committed = offsets[tp]
            self.commits[tp] = (offsets[tp], part.commit_mark)

    async def commit_at_once(self) -> None:
        """Commit the settled prefixes now (a rebalance, a stop), after any commit in flight."""
        async with self._commit_lock:
            await self._commit_now()

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        if not revoked:
            return  # the first join revokes nothing
        self._purge(revoked)
        await self._await_settled(revoked, self.settings.revoke_grace)
        try:
            await self.commit_at_once()
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
        # drop them rather than run them twice. Nothing from the first of them on can be
        # committed, so the partition's bookkeeping forgets that whole tail.
        kept: deque[Delivery] = deque()
        first: dict[TopicPartition, int] = {}
        for delivery in self.buffer:
            token: Token = delivery.token
            if token.tp in revoked:
                first[token.tp] = min(token.offset, first.get(token.tp, token.offset))
            else:
                kept.append(delivery)
        self.buffer = kept
        for tp, offset in first.items():
            if tp in self.parts:
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
            await self.commit_at_once()
        except TransportError as exc:
            logger.warning("%s; settled deliveries after the last commit will be redelivered", exc)
        self.parts.clear()
        self.buffer.clear()
        await quietly(self.consumer.stop(), f"leaving group {self.group!r}",
                       self.settings.request_timeout)
