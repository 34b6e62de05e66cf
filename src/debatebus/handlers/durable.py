"""Durable debates: per-round checkpoints, resume on any worker, leases and idempotent results.

The round is the retry unit: a round is committed (appended to the store) before the next starts,
so a crash re-runs at most the round in progress. A finished debate's result is stored by debate id
and every later delivery of it — redelivery, duplicate publish, ops replay — gets the stored result
with zero LLM calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from typing import TYPE_CHECKING, Any

from debatebus.checkpoints.base import CheckpointStore, Opening
from debatebus.engine.prompts import PROTOCOL_VERSION
from debatebus.engine.result import Progress
from debatebus.engine.run import OnEvent
from debatebus.engine.transcript import Round, Turn
from debatebus.exceptions import LeaseLostError, TransportError
from debatebus.handlers.checkpointing import (
    CheckpointHeader,
    counters_of,
    decode_header,
    decode_result,
    encode_entry,
    encode_header,
    encode_result,
    restore_progress,
)
from debatebus.schemas.envelope import now_iso
from debatebus.schemas.results import failure_fields, result_fields

if TYPE_CHECKING:
    from debatebus.engine.debate import Debate

__all__ = ["DurableRunner", "LeaseKeeper", "default_owner"]

log = logging.getLogger("debatebus.durable")


def default_owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class LeaseKeeper:
    """Renews every lease this process holds, every ttl/3, from one background task, and cancels
    the run of any debate whose lease could not be renewed."""

    def __init__(self, store: CheckpointStore, owner: str, ttl_s: float) -> None:
        self.store = store
        self.owner = owner
        self.ttl_s = ttl_s
        self.held: dict[str, asyncio.Task[Any]] = {}
        self.lost: set[str] = set()
        self._loop_task: asyncio.Task[None] | None = None

    def track(self, debate_id: str, run: asyncio.Task[Any]) -> None:
        self.held[debate_id] = run
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._renew_forever())

    def untrack(self, debate_id: str) -> bool:
        """Stop renewing; True when the lease had been lost meanwhile."""
        self.held.pop(debate_id, None)
        if debate_id in self.lost:
            self.lost.discard(debate_id)
            return True
        return False

    async def _renew_forever(self) -> None:
        while self.held:
            await asyncio.sleep(self.ttl_s / 3)
            for debate_id, run in list(self.held.items()):
                await self._renew(debate_id, run)

    async def _renew(self, debate_id: str, run: asyncio.Task[Any]) -> None:
        try:
            still_ours = await self.store.renew_lease(debate_id, self.owner, self.ttl_s)
        except TransportError as exc:  # the store may be back before the lease expires
            log.warning("could not renew the lease on debate %s: %s", debate_id, exc)
            return
        if not still_ours and debate_id in self.held:
            log.warning("lost the lease on debate %s: stopping its run", debate_id)
            self.lost.add(debate_id)
            run.cancel()


class DurableRunner:
    """Runs a debate against a CheckpointStore; returns the ``debate*`` result fields."""

    def __init__(self, debate: Debate, store: CheckpointStore, *, owner: str | None = None,
                 lease_ttl_s: float = 30.0, lease_poll_s: float = 1.0) -> None:
        self.debate = debate
        self.store = store
        self.owner = owner or default_owner()
        self.lease_poll_s = lease_poll_s
        self.keeper = LeaseKeeper(store, self.owner, lease_ttl_s)

    async def run(self, topic: str, debate_id: str, max_rounds: int | None,
                  request_id: str | None, on_event: OnEvent | None) -> dict[str, Any]:
        header = self._header(debate_id, topic)
        encoded = encode_header(header)
        opening = await self._open(debate_id, encoded)
        if opening.result is not None:
            if opening.acquired:
                await self._release(debate_id)
            return _replayed(opening.result)
        finished = False
        try:
            progress = self._restore(debate_id, topic, header, encoded, opening)
            if isinstance(progress, str):
                return failure_fields(debate_id, progress)
            fields = await self._run_leased(topic, debate_id, max_rounds, request_id, on_event,
                                            progress)
            await self.store.finish(debate_id, self.owner, encode_result(fields))
            finished = True
            return fields
        finally:
            if not finished:
                await self._release(debate_id)

    async def _open(self, debate_id: str, encoded: bytes) -> Opening:
        """Wait while another live worker holds the debate: never start a second run of it."""
        while True:
            opening = await self.store.start(debate_id, self.owner, self.keeper.ttl_s, encoded)
            if opening.result is not None or opening.acquired:
                return opening
            remaining = opening.lease.expires_in_s if opening.lease else 0.0
            await asyncio.sleep(min(max(remaining, 0.05), self.lease_poll_s))

    async def _release(self, debate_id: str) -> None:
        with contextlib.suppress(TransportError):
            await self.store.release_lease(debate_id, self.owner)

    def _header(self, debate_id: str, topic: str) -> CheckpointHeader:
        return CheckpointHeader(
            debate_id=debate_id, debate_name=self.debate.spec.name,
            definition_hash=self.debate.definition_hash, protocol_version=PROTOCOL_VERSION,
            topic=topic, created_at=now_iso(),
        )

    def _restore(self, debate_id: str, topic: str, header: CheckpointHeader, encoded: bytes,
                 opening: Opening) -> Progress | str | None:
        """Committed progress (None when fresh), or why it can't be resumed."""
        stored = opening.header
        first = header if stored is None or stored == encoded else decode_header(stored)
        if first.topic != topic:
            return (f"debate {debate_id!r} was started on another topic ({first.topic[:80]!r}): "
                    'send a new debateId, or "replay": "rerun" to start afresh')
        if first.definition_hash != header.definition_hash and self.debate.drift == "strict":
            return (f"debate {header.debate_name!r} changed since debate {debate_id!r} was "
                    f"checkpointed (definition {first.definition_hash} → "
                    f"{header.definition_hash}): resume with drift='loose', or send "
                    '"replay": "rerun" to start afresh')
        checkpoint = opening.checkpoint
        if checkpoint is None or (not checkpoint.entries and checkpoint.counters.calls == 0):
            return None
        return restore_progress(checkpoint, self.debate.spec)

    async def _run_leased(self, topic: str, debate_id: str, max_rounds: int | None,
                          request_id: str | None, on_event: OnEvent | None,
                          progress: Progress | None) -> dict[str, Any]:
        async def commit(state: Progress, item: Turn | Round) -> None:
            # The framing and every round are written before the debate goes on, so a crash
            # costs at most the calls of the step it interrupted.
            await self.store.append_many(debate_id, [encode_entry(item)], counters_of(state))

        # The keeper cancels this very task if the lease is lost: cheaper than a child task per
        # debate, and uncancel() tells a lost lease from a shutdown.
        task = asyncio.current_task()
        assert task is not None
        self.keeper.track(debate_id, task)
        try:
            result = await self.debate.run(
                topic, debate_id=debate_id, max_rounds=max_rounds, on_event=on_event,
                resume=progress, on_commit=commit, request_id=request_id)
        except asyncio.CancelledError:
            if self.keeper.untrack(debate_id) and task.uncancel() == 0:
                raise _lease_lost(debate_id) from None
            raise
        if self.keeper.untrack(debate_id):  # lost as the debate ended: don't publish it
            raise _lease_lost(debate_id)
        return result_fields(result)


def _lease_lost(debate_id: str) -> LeaseLostError:
    return LeaseLostError(f"lost the lease on debate {debate_id!r}: another worker may resume it")


def _replayed(stored: bytes) -> dict[str, Any]:
    fields = decode_result(stored)
    fields["debateReplayed"] = True
    return fields
