"""A wire dialect: the rules by which a transport's peers expect a request to be settled.

The settler asks the transport's dialect (``Transport.dialect``) at its few decision points:
whether to take a request at all (``claim``), how a handler's returned result is published
(``answered``), what a result's body is (``result_body``) and what a debate event's body is
(``event_body``). ``WireDialect`` is debatebus's own rules, every transport's default; Redis
pub/sub declares Synkro's (``debatebus.transports._synkro.SynkroDialect``). docs/wire-format.md
sets the two side by side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from debatebus.schemas.envelope import ENVELOPE_ENCODER, Envelope
from debatebus.schemas.result import HandlerResult

if TYPE_CHECKING:
    from debatebus.transports._base import Delivery


class WireDialect:
    """debatebus's own rules: every delivery is handled (the broker and the checkpoint store
    keep requests from being answered twice), results are published as the handler returned
    them, bodies are the envelope, events are published as they are."""

    name: str = "debatebus"

    async def claim(self, delivery: Delivery, request_id: str) -> bool:
        """Take ``delivery`` for handling; False: leave it alone (another member of the fleet
        has it or answered it). A taken delivery is let go when it is settled or released."""
        return True

    def answered(self, result: HandlerResult) -> HandlerResult:
        """A result the handler returned (not a failure raised as bad input), as published."""
        return result

    def result_body(self, request_body: bytes, envelope: Envelope, failed: bool) -> bytes:
        """The body of the result ``envelope`` answering the request whose body was
        ``request_body`` (``failed``: on ``event:{type}:failed``)."""
        return ENVELOPE_ENCODER.encode(envelope)

    def event_body(self, request_id: str, seq: int, event: bytes) -> bytes:
        """The body of a debate's ``seq``-th event (``event``: its JSON) on the events topic."""
        return event


#: debatebus's own rules: what a transport speaks unless it declares another dialect.
DEBATEBUS_WIRE: Final = WireDialect()
