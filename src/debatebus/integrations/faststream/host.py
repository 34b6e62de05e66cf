"""Serving one request the way a ``DebateBus`` worker settles it, over a FastStream broker.

The rules are ``debatebus.settler``'s (``bad_input``, ``failure_result``, ``result_message``):
the result envelope goes on ``event:{type}:completed`` / ``…:failed``; bad input becomes a
``:failed`` event when its request id can be read and a dead letter when it cannot. A ``Wire``
says how a framework publishes those two kinds of message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from faststream.message import StreamMessage

from debatebus.exceptions import InputError
from debatebus.handlers.contract import Handle, HandlerContext
from debatebus.schemas.envelope import Envelope, decode_request
from debatebus.schemas.result import HandlerResult
from debatebus.settler import bad_input, failure_result, result_message
from debatebus.transports.base import Delivery, Outgoing

__all__ = ["Host", "Wire", "raw_body"]


class Wire(Protocol):
    """How a host publishes: a result envelope, and a dead letter (original bytes, a reason)."""

    async def answer(self, message: Outgoing) -> None: ...

    async def dead_letter(self, delivery: Delivery, reason: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Host:
    """One mounted handler: ``serve`` answers a delivery once (the framework's redelivery may
    answer it again: the copy has the same ``messageId``), or dead-letters it. An
    exception other than ``InputError`` (a handler bug, a broker error) is raised for the
    framework to redeliver the request."""

    handle: Handle
    wire: Wire

    async def serve(self, delivery: Delivery) -> None:
        try:
            request = decode_request(delivery.body)
        except InputError as exc:
            answer = bad_input(delivery.body, delivery.topic, str(exc))
            if answer is None:
                await self.wire.dead_letter(delivery, str(exc))
                return
            request, result = answer
        else:
            result = await self._result(request, delivery)
        await self.wire.answer(result_message(request, delivery.topic, result, request.headers))

    async def _result(self, request: Envelope, delivery: Delivery) -> HandlerResult:
        try:
            return await self.handle(request.payload,
                                     HandlerContext(request.request_id, None, delivery))
        except InputError as exc:
            return failure_result(request.payload, request.request_id, str(exc))


async def raw_body(message: StreamMessage[Any]) -> Any:
    """A FastStream decoder leaving the body as bytes: the host decodes it, with debatebus's
    rules (FastStream's own decoder would fail first on a body nested too deeply)."""
    return message.body
