"""Serving one request the way a ``DebateBus`` worker settles it, over a FastStream broker.

The flow is ``debatebus._settler``'s (``Flow``): the result envelope goes on
``event:{type}:completed`` / ``…:failed``; bad input becomes a ``:failed`` event when its request
id can be read and a dead letter when it cannot. A ``Wire`` says how a framework publishes those
two kinds of message. The framework owns delivery counts, size limits and redelivery: the flow
runs without the worker's limits, and raises every error but bad input to the framework.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from faststream.message import StreamMessage

from debatebus._settler import Flow
from debatebus.handlers._contract import Handle, HandlerContext
from debatebus.observability._observer import RequestContext
from debatebus.schemas.envelope import Envelope
from debatebus.transports._base import Delivery, Outgoing


class Wire(Protocol):
    """How a host publishes: a result envelope, and a dead letter (original bytes, a reason)."""

    async def answer(self, message: Outgoing) -> None: ...

    async def dead_letter(self, delivery: Delivery, reason: str) -> None: ...


@dataclass(frozen=True, slots=True)
class _WireOutlet:
    """A ``Wire`` as the flow's ``Outlet``."""

    wire: Wire

    async def answer(self, delivery: Delivery, message: Outgoing) -> None:
        await self.wire.answer(message)

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        await self.wire.dead_letter(delivery, reason)


def _context(request: Envelope, delivery: Delivery, ctx: RequestContext | None) -> HandlerContext:
    """A hosted handler's context: no event sink, and no transport of debatebus's to publish on."""
    return HandlerContext(request.request_id, None, delivery)


@dataclass(frozen=True, slots=True)
class Host:
    """One mounted handler: ``serve`` answers a delivery once (the framework's redelivery may
    answer it again: the copy has the same ``messageId``), or dead-letters it. An
    exception other than ``InputError`` (a handler bug, a broker error) is raised for the
    framework to redeliver the request."""

    handle: Handle
    wire: Wire
    _flow: Flow = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_flow", Flow(_WireOutlet(self.wire), _context))

    async def serve(self, delivery: Delivery) -> None:
        await self._flow.settle(delivery, self.handle, None)


async def raw_body(message: StreamMessage[Any]) -> Any:
    """A FastStream decoder leaving the body as bytes: the host decodes it, with debatebus's
    rules (FastStream's own decoder would fail first on a body nested too deeply)."""
    return message.body
