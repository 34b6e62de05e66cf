"""The one way a bus calls a handler: ``await handle(payload, ctx) -> HandlerResult``.

Two kinds of handler can be subscribed, told apart once, by ``DebateBus.subscribe``:

* a ``BusHandler`` — an object with ``async def handle(payload, ctx) -> HandlerResult`` (what
  ``Debate.as_handler()`` returns): it gets the request id, the event sink and the delivery;
* a plain ``async def h(payload) -> Mapping``: ``adapt`` wraps it once, reading its
  ``debateStatus`` / ``debateReplayed`` fields (the wire names) into a ``HandlerResult``.

The worker and the observers read the result's attributes; its ``fields`` are what is published.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from debatebus.engine._run import EventTypes, OnEvent
from debatebus.exceptions import ConfigError
from debatebus.handlers._streaming import OnDelta
from debatebus.schemas.result import HandlerResult, Status
from debatebus.transports._base import Delivery, Transport

if TYPE_CHECKING:
    from debatebus.client import Answers

class Slot:
    """One of a worker's ``concurrency`` permits, held by the task handling ``delivery``. Its
    handler may lend it out while it waits on other requests (``HandlerContext.waiting``):
    ``transport`` is told both ways (``Transport.slot_lent``), so the delivery does not hold a
    place the requests it waits for need."""

    __slots__ = ("_delivery", "_permits", "_transport", "held")

    def __init__(self, permits: asyncio.Semaphore, transport: Transport,
                 delivery: Delivery) -> None:
        self._permits = permits
        self._transport = transport
        self._delivery = delivery
        self.held = True

    def release(self) -> None:
        """Give the permit back (once: later calls do nothing until it is taken again)."""
        if self.held:
            self.held = False
            self._permits.release()

    def lend(self) -> None:
        """Give the permit back while the handler waits on other requests."""
        self.release()
        self._transport.slot_lent(self._delivery, True)

    async def take_back(self) -> None:
        """Wait for a free permit and hold it again (the delivery counts again even when the
        wait is cancelled: its task is ending, and settles or releases it)."""
        try:
            await self._permits.acquire()
            self.held = True
        finally:
            self._transport.slot_lent(self._delivery, False)


#: The slot of the delivery the current task handles (the worker sets it per task).
current_slot: ContextVar[Slot | None] = ContextVar("debatebus_slot", default=None)


@dataclass(frozen=True, slots=True)
class HandlerContext:
    """What a handler may need besides the payload: the request's id, where the debate's events
    go (None: nobody listens), the delivery being handled (event type, id, delivery count), the
    transport it came from, to publish on (sub-debates and persons' turns do; None: no bus), the
    kinds of event ``on_event`` takes (None: all; the engine builds no other), where to wait for
    the results of what it publishes, and where a streamed turn's deltas go (None: the worker
    publishes no events, so nobody could read them)."""

    request_id: str
    on_event: OnEvent | None
    delivery: Delivery
    transport: Transport | None = None
    event_types: EventTypes = None
    #: The worker's waits for results of requests it publishes (sub-debates, persons' turns), on
    #: ``transport``.
    answers: Answers | None = None
    #: Publishes one ``TurnDelta`` on the events topic (``as_handler(stream_turns=True)``).
    on_delta: OnDelta | None = None

    @contextlib.asynccontextmanager
    async def waiting(self) -> AsyncIterator[None]:
        """``async with ctx.waiting():`` around a wait on other requests (e.g. a sub-debate):
        the worker may take another delivery meanwhile (its concurrency slot is lent out), and
        the slot is taken back, waiting for a free one, before the block ends."""
        slot = current_slot.get()
        if slot is None or not slot.held:
            yield
            return
        slot.lend()
        try:
            yield
        finally:
            await slot.take_back()


@runtime_checkable
class BusHandler(Protocol):
    """A handler that takes the context: ``DebateHandler`` is one."""

    async def handle(self, payload: Mapping[str, Any], ctx: HandlerContext) -> HandlerResult: ...


PlainHandler = Callable[[Mapping[str, Any]], Awaitable[Mapping[str, Any]]]
#: What ``DebateBus.subscribe`` accepts.
Handler = BusHandler | PlainHandler
#: What the worker calls: every handler, adapted once.
Handle = Callable[[Mapping[str, Any], HandlerContext], Awaitable[HandlerResult]]


def adapt(handler: Handler) -> Handle:
    """``handler`` as a ``Handle``: a ``BusHandler``'s own ``handle``, or a plain handler wrapped.
    ``ConfigError`` for anything else."""
    if isinstance(handler, BusHandler):
        return handler.handle
    if not callable(handler):
        raise ConfigError(f"a handler must be an async callable or have an async handle(payload, "
                          f"ctx) method, got {handler!r}")
    plain = handler

    async def handle(payload: Mapping[str, Any], ctx: HandlerContext) -> HandlerResult:
        fields = dict(await plain(payload))
        status: Status = "failed" if fields.get("debateStatus") == "failed" else "completed"
        return HandlerResult(status, fields, bool(fields.get("debateReplayed")))

    return handle
