"""Sub-debates on a bus: a child debate is a request like any other, served by whichever worker
subscribes to its domain's event type.

``BusChildren`` is the ``ChildRunner`` a ``DebateHandler`` gives its debate when it runs on a bus.
For a domain mapped to an event type it publishes ``{"requestId": <child id>, "payload":
{"input": <child question>, "parentDebateId", "depth"}}`` and waits, with the worker's slot lent
out (``HandlerContext.waiting``), for ``event:<type>:completed|failed`` of that request id. A
durable parent commits the child's record in its checkpoint before publishing (``commit``), so a
resumed parent waits for the same child instead of publishing a second one; and a child whose
result is already in the store (same store, kept under ``debate_key(event type, child id)``) is
not waited for at all. The record carries the ``messageId`` of the child's request, and only a
result caused by that message (its ``causationId``) answers the child: a result another producer
planted under the child's predictable id is passed over. The store stays the source of truth.
Domains mapped to a panel or a ``Debate`` run in this process (``local``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from debatebus._usage import ZERO_USAGE, TokenUsage
from debatebus.checkpoints._base import CheckpointStore
from debatebus.client import Answers, request_message
from debatebus.engine._subdebates import ChildOutcome, ChildRequest, ChildRunner, SubDebateRecord
from debatebus.handlers._checkpointing import debate_key, decode_result
from debatebus.schemas.cost import DebateCost
from debatebus.schemas.envelope import new_message_id
from debatebus.transports._base import Transport

if TYPE_CHECKING:
    from debatebus.engine._result import Progress

#: Commits a child's record in the parent's checkpoint; False when it was there already (a
#: resumed parent: its request was published by the run that committed it).
CommitChild = Callable[[SubDebateRecord, "Progress"], Awaitable[bool]]


def child_payload(request: ChildRequest) -> dict[str, Any]:
    """A child request's payload: its question, its parent's debate id and its depth."""
    return {"input": request.question, "parentDebateId": request.parent_id,
            "depth": request.depth}


def _usage(fields: Mapping[str, Any]) -> TokenUsage:
    raw = fields.get("debateTotalTokenUsage") or fields.get("debateTokenUsage")
    if not isinstance(raw, Mapping):
        return ZERO_USAGE
    return TokenUsage(int(raw.get("promptTokens", 0)), int(raw.get("completionTokens", 0)),
                      int(raw.get("totalTokens", 0)), int(raw.get("cacheReadTokens", 0)),
                      int(raw.get("cacheWriteTokens", 0)))


def _cost(fields: Mapping[str, Any]) -> DebateCost | None:
    """The child's ``debateCost`` (None when absent: its prices were not known, or a worker older
    than costs answered; one that does not decode is not known either)."""
    raw = fields.get("debateCost")
    if raw is None:
        return None
    try:
        return msgspec.convert(raw, DebateCost)
    except msgspec.ValidationError:
        return None


def outcome_of(fields: Mapping[str, Any]) -> ChildOutcome:
    """A child's result fields (published or stored) as the outcome the parent's engine takes."""
    usage, cost = _usage(fields), _cost(fields)
    if fields.get("debateStatus") != "completed":
        error = fields.get("debateError")
        return ChildOutcome("failed", usage=usage,
                            error=str(error) if error else "the child debate failed", cost=cost)
    synthesis = fields.get("debateSynthesis") or fields.get("debateOutput")
    return ChildOutcome("completed", str(synthesis) if synthesis else "", usage, cost=cost)


@dataclass(frozen=True, slots=True)
class BusChildren:
    """Runs each event-type child on ``transport``, waiting inside ``waiting()``; other targets
    go to ``local``. ``store`` (the parent's checkpoint store, shared with the children's
    workers) and ``commit`` are a durable parent's; the parent's engine bounds the wait."""

    transport: Transport
    answers: Answers
    waiting: Callable[[], contextlib.AbstractAsyncContextManager[None]]
    local: ChildRunner
    store: CheckpointStore | None = None
    commit: CommitChild | None = None

    async def __call__(self, request: ChildRequest) -> ChildOutcome:
        event_type = request.target
        if not isinstance(event_type, str):
            return await self.local(request)
        stored = await self._stored(event_type, request.child_id)
        if stored is not None:
            return stored
        record = next(r for r in request.parent_progress.sub_debates
                      if r.child_id == request.child_id)
        if record.message_id is None and record.status == "running":
            record.message_id = new_message_id()  # committed with the record, then published
        # Listening before publishing, on the worker's one subscription to the event type, for
        # the result of the very message published: a result planted under the child's id by
        # anyone else is passed over. (A record from before message ids takes any.)
        answer = await self.answers.expect(event_type, request.child_id,
                                           caused_by=record.message_id)
        try:
            stored = await self._stored(event_type, request.child_id)  # finished meanwhile
            if stored is not None:
                return stored
            if await self._committed_now(record, request):
                await self.transport.publish(request_message(
                    event_type, child_payload(request), request_id=request.child_id,
                    correlation_id=request.parent_id, message_id=record.message_id))
            async with self.waiting():
                return outcome_of((await answer).payload)
        finally:
            self.answers.forget(event_type, request.child_id)

    async def _stored(self, event_type: str, child_id: str) -> ChildOutcome | None:
        if self.store is None:
            return None
        data = await self.store.get_result(debate_key(event_type, child_id))
        return None if data is None else outcome_of(decode_result(data).fields)

    async def _committed_now(self, record: SubDebateRecord, request: ChildRequest) -> bool:
        """Commit the child's ``record`` before its request is published; False when an earlier
        run of the parent committed (and so published) it."""
        if self.commit is None:
            return True
        return await self.commit(record, request.parent_progress)
