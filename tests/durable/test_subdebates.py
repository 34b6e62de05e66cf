"""A durable parent's sub-debate on the bus: the child's id is committed before its request is
published, so a parent resumed after a crash waits for that same child (or takes its stored
result) instead of publishing a second one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgspec
from tests.support.subdebates import (
    PANEL_SAYS,
    QUESTION,
    Calls,
    child_answer,
    launch,
    parent_answer,
    revision_of,
    security_panel,
    types,
)

from debatebus._settler import result_message
from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.client import Answers
from debatebus.handlers._checkpointing import debate_key
from debatebus.handlers._contract import HandlerContext, HandlerResult
from debatebus.schemas.envelope import ENVELOPE_DECODER, Envelope
from debatebus.transports import Delivery
from debatebus.transports._memory import MemoryBroker, MemoryTransport

CHILD_ID = "p1~sub-security-1"


class Setup:
    def __init__(self) -> None:
        self.store = MemoryCheckpointStore()
        self.transport = MemoryTransport(MemoryBroker())
        self.answers = Answers(self.transport)
        self.parent_type, self.security_type = types()
        self.parent, self.child = Calls(parent_answer), Calls(child_answer)

    def ctx(self, request_id: str, event_type: str) -> HandlerContext:
        return HandlerContext(request_id, None, Delivery(event_type, b"", "1-0"), self.transport,
                              answers=self.answers)

    def parent_worker(self) -> asyncio.Task[HandlerResult]:
        """The parent's request handled by a new worker (a new handler on the shared store)."""
        handler = launch(self.parent.llm, self.security_type).as_handler(store=self.store)
        return asyncio.create_task(handler.handle({"input": QUESTION},
                                                  self.ctx("p1", self.parent_type)))

    async def serve_child(self, request: Envelope, *, announce: bool) -> None:
        """The child handled by its own worker on the shared store; ``announce``: its result
        published too (else the worker died right after storing it)."""
        handler = security_panel(self.child.llm).as_handler(store=self.store)
        result = await handler.handle(request.payload, self.ctx(CHILD_ID, self.security_type))
        if announce:
            await self.transport.publish(result_message(request, self.security_type, result, {}))


async def next_request(requests: AsyncIterator[Delivery], timeout: float = 10.0) -> Envelope:
    async with asyncio.timeout(timeout):
        return ENVELOPE_DECODER.decode((await anext(requests)).body)


async def no_request(requests: AsyncIterator[Delivery], within: float = 0.5) -> bool:
    with contextlib.suppress(TimeoutError):
        await next_request(requests, within)
        return False
    return True


async def crashed_after_publishing(setup: Setup) -> tuple[Envelope, AsyncIterator[Delivery]]:
    """A parent that published its child's request, then died: its child request, and the
    subscription to the child's event type (past that request)."""
    requests = await setup.transport.subscribe([setup.security_type])
    first = setup.parent_worker()
    request = await next_request(requests)
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    return request, requests


async def test_the_childs_id_is_committed_before_its_request_is_published():
    setup = Setup()
    requests = await setup.transport.subscribe([setup.security_type])
    running = setup.parent_worker()
    request = await next_request(requests)
    checkpoint = await setup.store.load(debate_key(setup.parent_type, "p1"))
    assert checkpoint is not None
    last = msgspec.json.decode(checkpoint.entries[-1])
    assert last["type"] == "child"
    assert (last["child"]["child_id"], last["child"]["requested_by"], last["child"]["status"]) == (
        request.request_id, "alice", "running")
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running


async def test_a_resumed_parent_waits_for_the_same_child():
    setup = Setup()
    request, requests = await crashed_after_publishing(setup)
    resumed = setup.parent_worker()
    assert await no_request(requests)  # waiting for the committed child, not publishing another
    assert not resumed.done()
    await setup.serve_child(request, announce=True)
    result = await asyncio.wait_for(resumed, 10)

    assert result.fields["debateStatus"] == "completed"
    assert revision_of(Envelope("p1", result.fields), "alice") == (
        f"alice revised after the panel: {PANEL_SAYS}")
    assert len(setup.child.calls) == 5  # one child debate


async def test_a_resumed_parent_takes_a_finished_childs_stored_result():
    setup = Setup()
    request, requests = await crashed_after_publishing(setup)
    await setup.serve_child(request, announce=False)  # its result stored, never seen by the parent
    result = await asyncio.wait_for(setup.parent_worker(), 10)

    assert await no_request(requests, within=0.1)
    assert result.fields["debateStatus"] == "completed"
    (listed,) = result.fields["debateSubDebates"]
    assert (listed["debateId"], listed["status"], listed["synthesis"]) == (
        CHILD_ID, "completed", PANEL_SAYS)
    assert len(setup.child.calls) == 5
