"""Durable debates: per-round checkpoints, resume on any worker, leases and idempotent results.

The round is the retry unit: each step (the framing, every round) is committed to the store as the
debate goes on, so a crash re-runs at most the step in progress, and the one before it if its
write was still on the wire (``_Commits``: group commit). A finished debate's result is stored
under its key (its debate id within the event type it was asked on: ``debate_key``) and every
later delivery of it — redelivery, duplicate publish, ops replay — gets the stored result with
zero LLM calls, provided it asks the same question (see ``checkpointing``).

Only a final result is stored: a completed debate, or a failure that running again cannot change
(a budget reached; bad input and drift never reach the store). A failure that may pass (a
provider's error, a wrong key, a timeout: ``DebateResult.retryable``) is published but not
stored, and its checkpoint is kept, so a resend or a replay after the fix resumes from the last
committed round: no committed round is paid twice. A broker, store or rate-limiter error inside
the debate is raised, not turned into a failure: the worker releases the delivery.

Each run takes the debate's lease under an owner of its own (never shared by two runs, even in one
process), so two copies of a request can never both hold it: the second waits for the first's
result. A lease left behind by a run of this same runner (its release failed in an outage) is
taken back at once rather than waited out: the single flight guarantees that run is over.

Every store call is bounded by the store itself (``CheckpointStore``'s ``timeout_s``). ``start``,
the commits and ``finish`` ride out a store outage of up to ``store_outage_s``, retried with
backoff (each is safe to repeat: the same run's owner re-takes its own lease, a repeated round
entry is skipped on restore, and ``finish`` overwrites), so a debate in flight survives a Redis
restart.

Checkpoints and results are kept for the runner's ``retention_s`` (None: the store's own); a
debate whose stored result expired runs again, and its result carries ``debateResultExpired``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from debatebus._backoff import Backoff
from debatebus._loops import PerLoop
from debatebus.checkpoints._base import CheckpointStore, Counters, Opening, retention_kw
from debatebus.engine._people import HumanTurnRecord, PlayedTurn
from debatebus.engine._prompts import PROTOCOL_VERSION
from debatebus.engine._result import DebateResult, Progress
from debatebus.engine._run import EventTypes, OnEvent, OnText
from debatebus.engine._subdebates import SubDebateRecord
from debatebus.engine._transcript import Round, Turn
from debatebus.exceptions import CheckpointMissingError, LeaseLostError, TransportError
from debatebus.handlers._checkpointing import (
    CheckpointHeader,
    ForkBasis,
    Item,
    committed_items,
    counters_of,
    decode_header,
    decode_result,
    encode_entry,
    encode_header,
    encode_result,
    restore_progress,
)
from debatebus.handlers._children import BusChildren
from debatebus.handlers._inputs import Ask, reused_id
from debatebus.handlers._leases import LeaseKeeper
from debatebus.handlers._people import BusPeople
from debatebus.handlers._results import RESULT_EXPIRED, failure_fields, fork_fields, result_fields
from debatebus.handlers._streaming import TurnStreams
from debatebus.schemas.envelope import now_iso

if TYPE_CHECKING:
    from debatebus.engine._debate import Debate

log = logging.getLogger("debatebus.durable")

T = TypeVar("T")

#: How long a debate in flight waits for its store to come back before giving up its delivery.
DEFAULT_STORE_OUTAGE_S = 120.0
#: Debates of one runner building and storing their result at once (``DurableRunner.run``).
FINISHING = 256
#: What a run does with a checkpoint written by another definition of its debate: refuse it
#: (``strict``) or resume it by round number (``loose``).
Drift = Literal["strict", "loose"]


def default_owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class DurableRunner:
    """Runs a debate against a CheckpointStore; returns the ``debate*`` result fields."""

    def __init__(self, debate: Debate, store: CheckpointStore, *, owner: str | None = None,
                 lease_ttl_s: float = 30.0, lease_poll_s: float = 1.0,
                 store_outage_s: float = DEFAULT_STORE_OUTAGE_S, drift: Drift = "strict",
                 retention_s: float | None = None) -> None:
        self.debate = debate
        self._retention = retention_kw(retention_s)  # for every store write
        self.drift = drift
        self.store = store
        self.owner = owner or default_owner()
        self.lease_poll_s = lease_poll_s
        self.store_outage_s = store_outage_s
        #: Every run of this runner, and no one else's, has a lease owner starting so (an owner
        #: name given to two workers is not enough to tell their runs apart).
        self._runs_prefix = f"{self.owner}/{secrets.token_hex(4)}/"
        self.keeper = LeaseKeeper(store, lease_ttl_s)
        #: Debates storing their result at once: a wave of debates ending together (a burst
        #: answered by a provider at once) builds each result only when it can be stored, so
        #: it holds a few hundred result documents at a time, not one per debate ending. A
        #: debate waits for its slot with its lease still renewed.
        self._finishing = PerLoop(lambda: asyncio.Semaphore(FINISHING))

    async def _patient(self, call: Callable[[], Awaitable[T]]) -> T:
        """A store call that rides out an outage: retried with backoff while the store fails,
        for up to ``store_outage_s``; then its last error. (The store bounds each attempt.)"""
        try:
            return await call()
        except TransportError:
            loop = asyncio.get_running_loop()
            give_up, backoff = loop.time() + self.store_outage_s, Backoff()
        while True:
            await asyncio.sleep(backoff.next())
            try:
                return await call()
            except TransportError:
                if loop.time() >= give_up:
                    raise

    def run_owner(self) -> str:
        """A lease owner for one run: this runner's owner and a part no other run shares."""
        return f"{self._runs_prefix}{secrets.token_hex(6)}"

    async def run(self, ask: Ask, on_event: OnEvent | None,
                  children: BusChildren | None = None,
                  event_types: EventTypes = None,
                  people: BusPeople | None = None,
                  streams: TurnStreams | None = None,
                  seed: Progress | None = None) -> dict[str, Any]:
        """The debate's result fields: stored, or from a run (resumed from its checkpoint).
        ``children`` (on a bus) publishes its sub-debates, and ``people`` its persons' turn
        requests, committing each before publishing; ``event_types``: the kinds of event
        ``on_event`` takes (None: all); ``streams``: where its turns stream to while they are
        written (None: they are not streamed). ``seed``: what a fork starts from (its parent's
        first rounds), committed as the debate's first entries when it has none yet."""
        key, owner = ask.key, self.run_owner()
        header = self._header(ask)
        encoded = encode_header(header)
        opening = await self._open(key, owner, encoded)
        if opening.result is not None:
            if opening.acquired:
                await self._release(key, owner)
            return _replayed(opening.result, ask)
        finished = False
        try:
            progress = self._restore(ask, header, encoded, opening)
            expired = opening.expired
            started_before = opening.header is not None and opening.header != encoded
            del header, encoded, opening  # not held while the debate runs: thousands may be
            if isinstance(progress, str):
                return failure_fields(ask.debate_id, progress)
            if progress is None and seed is not None:
                progress = await self._seed(key, seed)
            commits = _Commits(self, ask, progress)
            on_text = None if streams is None else streams.for_run(
                started_before=started_before,
                committed_rounds=len(progress.rounds) if progress is not None else 0)
            try:
                ran = await self._run_leased(ask, owner, on_event, event_types, commits, children,
                                             people, on_text)
            except BaseException:
                await commits.close(superseded=False)
                raise
            if ran.retryable:  # a failure that may pass: published, never stored as the answer
                self._finishing.get().release()
                await commits.close(superseded=False)  # a resend resumes from what it committed
                return self._fields(ran, ask)
            try:  # with one of the runner's finishing slots, which _run_leased took
                await commits.close(superseded=True)
                fields = self._fields(ran, ask, expired=expired)
                result = encode_result(fields, ask.fingerprint, self._basis(ask, ran))
                await self._patient(lambda: self.store.finish(key, owner, result,
                                                              **self._retention))
            finally:
                self._finishing.get().release()
            finished = True
            return fields
        finally:
            if not finished:
                await self._release(key, owner)

    def _fields(self, ran: DebateResult, ask: Ask, *, expired: bool = False) -> dict[str, Any]:
        """A run's result fields, marked when its stored result had expired or it is a fork."""
        fields = result_fields(ran)
        if expired:
            fields[RESULT_EXPIRED] = True
        if ask.fork is not None:
            fields.update(fork_fields(ask.fork.parent_id, ask.fork.from_round))
        return fields

    def _basis(self, ask: Ask, ran: DebateResult) -> ForkBasis:
        """What a fork of this finished debate will need besides its transcript."""
        moderator = self.debate.spec.moderator
        framing = None if ran.framing is None or moderator is None else Turn(
            speaker=moderator.name, round=0, text=ran.framing)
        return ForkBasis(question=ask.question, framing=framing)

    async def _seed(self, key: str, seed: Progress) -> Progress:
        """Commit a fork's starting point (its parent's framing and first rounds) as the first
        entries of its checkpoint; the progress it resumes from. Its counters start at zero:
        the fork pays only for what comes after."""
        await self._commit_all(key, seed)
        return seed

    async def _commit_all(self, key: str, progress: Progress) -> None:
        """Append everything ``progress`` holds (framing, rounds, records), with its counters."""
        entries = [encode_entry(item) for item in committed_items(progress)]
        if entries:
            await self.append(key, entries, counters_of(progress))

    async def _open(self, key: str, owner: str, encoded: bytes) -> Opening:
        """Wait while another run (here or on another worker) holds the debate: never start a
        second run of it."""
        while True:
            opening = await self._patient(lambda: self.store.start(
                key, owner, self.keeper.ttl_s, encoded, **self._retention))
            if opening.result is not None or opening.acquired:
                return opening
            if opening.lease is not None and opening.lease.owner.startswith(self._runs_prefix):
                # Ours, from a run that ended without releasing it (the single flight lets one
                # run per debate id at a time): take it back instead of waiting out its ttl.
                await self._release(key, opening.lease.owner)
                continue
            remaining = opening.lease.expires_in_s if opening.lease else 0.0
            await asyncio.sleep(min(max(remaining, 0.05), self.lease_poll_s))

    async def _release(self, key: str, owner: str) -> None:
        with contextlib.suppress(TransportError):
            await self.store.release_lease(key, owner)

    def _header(self, ask: Ask) -> CheckpointHeader:
        return CheckpointHeader(
            debate_id=ask.debate_id, debate_name=self.debate.spec.name,
            definition_hash=self.debate.definition_hash, protocol_version=PROTOCOL_VERSION,
            question=ask.question, created_at=now_iso(), fingerprint=ask.fingerprint,
        )

    def _restore(self, ask: Ask, header: CheckpointHeader, encoded: bytes,
                 opening: Opening) -> Progress | str | None:
        """Committed progress (None when fresh), or why it can't be resumed. Raises InputError
        when the checkpoint is another question's."""
        stored = opening.header
        first = header if stored is None or stored == encoded else decode_header(stored)
        if not ask.matches(first.fingerprint):
            raise reused_id(ask)
        if first.definition_hash != header.definition_hash and self.drift == "strict":
            return (f"debate {header.debate_name!r} changed since debate {ask.debate_id!r} was "
                    f"checkpointed (definition {first.definition_hash} → "
                    f"{header.definition_hash}): resume with drift='loose', or send "
                    '"replay": "rerun" to start afresh')
        checkpoint = opening.checkpoint
        if checkpoint is None or (not checkpoint.entries and checkpoint.counters.calls == 0):
            return None
        return restore_progress(checkpoint, self.debate.spec)

    async def rewrite(self, ask: Ask, progress: Progress) -> None:
        """The store lost the checkpoint of a debate this run holds (a Redis restarted without
        its data): write it again, whole, from the run's own ``progress``, so a crash from now on
        still resumes. Unless the debate's result is stored: then it finished elsewhere, and this
        run is stale (``LeaseLostError``: the worker releases its delivery)."""
        key = ask.key
        if await self._patient(lambda: self.store.get_result(key)) is not None:
            raise _lease_lost(ask.debate_id)
        log.warning("the checkpoint of debate %s was gone from the store (did it lose its data, "
                    "e.g. a Redis restart without persistence?): writing it again from the run's "
                    "own progress", key)
        header = encode_header(self._header(ask))
        await self._patient(lambda: self.store.begin(key, header, **self._retention))
        await self._commit_all(key, progress)

    async def append(self, key: str, entries: list[bytes], counters: Counters) -> None:
        """Commit ``entries`` of the debate kept under ``key``, with its counters, riding out a
        store outage."""
        await self._patient(lambda: self.store.append_many(
            key, entries, counters, **self._retention))

    async def _run_leased(self, ask: Ask, owner: str, on_event: OnEvent | None,
                          event_types: EventTypes, commits: _Commits,
                          children: BusChildren | None, people: BusPeople | None,
                          on_text: OnText | None) -> DebateResult:
        """The debate's run under its lease; it returns holding a finishing slot, waited for
        while the lease is still renewed (the caller releases it once the result is stored)."""
        debate_id = ask.debate_id
        if children is not None:
            children = replace(children, store=self.store, commit=commits.commit_child)
        if people is not None:
            people = replace(people, commit=commits.commit_person)
        # The keeper cancels this very task if the lease is lost: cheaper than a child task per
        # debate, and uncancel() tells a lost lease from a shutdown.
        task = asyncio.current_task()
        assert task is not None
        self.keeper.track(owner, ask.key, task)
        try:
            result = await self.debate.run(
                ask.question, debate_id=debate_id, max_rounds=ask.max_rounds, on_event=on_event,
                resume=commits.progress, on_commit=commits.commit, request_id=ask.request_id,
                children=children, depth=ask.depth, event_types=event_types, people=people,
                on_text=on_text)
            await self._finishing.get().acquire()
        except asyncio.CancelledError:
            if self.keeper.untrack(owner):
                commits.lost = True
                if task.uncancel() == 0:
                    raise _lease_lost(debate_id) from None
            raise
        except Exception:
            self.keeper.untrack(owner)  # or its lease would be renewed, and waited on, forever
            raise
        if self.keeper.untrack(owner):  # lost as the debate ended: don't publish it
            self._finishing.get().release()
            commits.lost = True
            raise _lease_lost(debate_id)
        return result


class _Commits:
    """A run's commits of its framing, rounds and children's records, written behind the debate
    (group commit): a commit is queued, and one writer task appends everything queued as one
    store call once the debate waits (on a model call). So a debate never waits on its store
    between rounds, and commits queued while a write is on the wire go out together with the next.

    - **Bounded**: a commit made while a write is still on the wire waits for it (and for its own
      write), so at most one step's commit is unconfirmed while the debate goes on, and a store
      outage stops the debate at its next commit instead of letting it spend calls.
    - **Superseded**: ``close(superseded=True)`` drops what the writer has not sent: the result
      ``finish`` stores replaces the checkpoint. (A debate that never waits between its steps,
      e.g. on an instant model, writes no checkpoint at all.)
    - **Failures**: a write that failed (after ``store_outage_s``) fails the run at its next
      commit, or at ``close``.
    - A child's record is written before its request is published (``commit_child`` waits), and
      so is a person's (``commit_person``), with the turns queued before it.

    One small object per debate in flight, not a closure each."""

    __slots__ = (
        "ask",
        "asked",
        "committed",
        "counters",
        "error",
        "lost",
        "pending",
        "progress",
        "runner",
        "state",
        "writer",
        "writing",
    )

    def __init__(self, runner: DurableRunner, ask: Ask, progress: Progress | None) -> None:
        self.runner = runner
        self.ask = ask
        self.progress = progress  # what the run resumes from (None: fresh)
        # Each child's last committed status (a resumed run's, from its checkpoint).
        self.committed = {r.child_id: r.status for r in progress.sub_debates} if progress else {}
        # The persons' turns asked for and committed (a resumed run's, from its checkpoint).
        self.asked = tuple(r.key for r in progress.people) if progress else ()
        self.pending: list[Item] = []
        self.counters = Counters()  # the progress's counters as of the newest pending entry
        self.state = progress  # the run's progress as of the newest commit
        self.writer: asyncio.Task[None] | None = None
        self.writing = False  # the writer's store call is on the wire
        self.error: Exception | None = None
        self.lost = False  # the lease was lost: write nothing more

    async def commit(self, state: Progress, item: Turn | Round | PlayedTurn) -> None:
        """Queue the framing, a round or a turn played alone, with the final records of the
        children whose outcome it used."""
        if state.sub_debates:
            committed = self.committed
            ended = [r for r in state.sub_debates if committed.get(r.child_id) != r.status]
            committed.update((r.child_id, r.status) for r in ended)
            self.pending.extend(ended)
        self.pending.append(item)
        await self._queued(state)

    async def commit_child(self, record: SubDebateRecord, state: Progress) -> bool:
        if record.child_id in self.committed:
            return False
        self.committed[record.child_id] = record.status
        self.pending.append(record)
        await self._queued(state)
        await self._settled()
        return True

    async def commit_person(self, record: HumanTurnRecord, state: Progress) -> bool:
        """Write a person's turn record (and what was queued before it) before its request is
        published; False when an earlier run committed (and so published) it."""
        if record.key in self.asked:
            return False
        self.asked = (*self.asked, record.key)
        self.pending.append(record)
        await self._queued(state)
        await self._settled()
        return True

    async def _queued(self, state: Progress) -> None:
        self.counters, self.state = counters_of(state), state
        self.check()
        if self.writing:  # the previous write is still on the wire: wait (this one goes next)
            await self._settled()
        elif self.writer is None:
            self.writer = asyncio.create_task(self._write())

    async def _settled(self) -> None:
        """Wait until the writer has written everything queued; raise what it failed with."""
        if self.writer is not None:
            await asyncio.wait((self.writer,))
        self.check()

    async def _write(self) -> None:
        try:
            while self.pending and not self.lost:
                entries, counters = [*map(encode_entry, self.pending)], self.counters
                self.pending = []
                self.writing = True
                try:
                    await self.runner.append(self.ask.key, entries, counters)
                except CheckpointMissingError:
                    assert self.state is not None  # set by the commit that queued the entries
                    await self.runner.rewrite(self.ask, self.state)
        except Exception as e:  # the run raises it at its next commit, or at its end
            self.error = e
        finally:
            self.writing, self.writer = False, None

    def check(self) -> None:
        """Raise what a write failed with: the run fails, as it would have at an awaited commit."""
        if self.error is not None:
            raise self.error

    async def close(self, *, superseded: bool) -> None:
        """The run is over. Finished (``superseded``): what the writer has not sent is dropped,
        since the result replaces the checkpoint, and a failed write fails the run. Failed: what
        is queued is still written, for the delivery that resumes it; after a lost lease, nothing
        more. Either way a write on the wire is waited for, so nothing of this run's lands after
        its lease is released."""
        if superseded or self.lost:
            self.pending = []
        writer = self.writer
        if writer is not None and (self.writing or self.pending):
            if self.lost:
                writer.cancel()
            await asyncio.wait((writer,))
        # (A writer that has not started ends at its first step: nothing is left for it.)
        if superseded:
            self.check()


def _lease_lost(debate_id: str) -> LeaseLostError:
    return LeaseLostError(f"lost the lease on debate {debate_id!r}: another worker may resume it")


def _replayed(data: bytes, ask: Ask) -> dict[str, Any]:
    stored = decode_result(data)
    if not ask.matches(stored.fingerprint):
        raise reused_id(ask)
    stored.fields["debateReplayed"] = True
    return stored.fields
