"""People on a bus: a person's turn is a request like any other, answered by a reply.

``BusPeople`` is the ``PeopleRunner`` a ``DebateHandler`` gives its debate on a bus. For a
``HumanParticipant``'s turn it publishes a *turn request* on the person's event type
(``turn_request_message``: the prompt, the transcript so far, the turn's key as ``requestId``, the
deadline) and waits, with the worker's slot lent out (``HandlerContext.waiting``), for the *reply*:
an envelope on ``event:<type>:completed`` with that ``requestId`` and, as its ``causationId``, the
request's ``messageId`` (``turn_reply`` writes one) — exactly what a debatebus worker publishes for
a handler subscribed to that event type, so whatever answers (a person's page, a service in any
language, a plain ``DebateBus`` handler returning ``{"text": …}``) is a bus participant like any
other. The wire is in docs/people.md.

A durable debate commits the turn's record in its checkpoint before publishing (``commit``), so
a debate resumed on another worker waits for the same turn instead of asking again. Listening
starts before publishing, so the first run cannot miss its reply; a resumed run, which was not
listening when the reply may have come, first looks for it in the broker's history of the reply
topic (``Transport.read_range``: Redis Streams, Kafka, memory; Redis pub/sub keeps none, so there a
reply sent while no worker listened is lost and the turn waits out its deadline).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from debatebus.client import Answers, request_message
from debatebus.engine._people import HumanTurnRecord, TurnRequest, iso_time
from debatebus.engine._result import Progress
from debatebus.exceptions import InputError, NotSupportedError
from debatebus.schemas.envelope import (
    ENVELOPE_DECODER,
    ENVELOPE_ENCODER,
    Envelope,
    completed_topic,
    failed_topic,
    new_message_id,
    now_iso,
)
from debatebus.transports._base import Outgoing, Transport

#: The longest reply text a turn takes (the question's own limit).
MAX_REPLY_BYTES: Final = 64 * 1024

#: Commits a person's turn record in the debate's checkpoint; False when it was there already (a
#: resumed debate: its request was published by the run that committed it).
CommitPerson = Callable[[HumanTurnRecord, Progress], Awaitable[bool]]


def turn_payload(request: TurnRequest) -> dict[str, Any]:
    """A turn request's payload (docs/people.md)."""
    record = request.record
    return {"turnKey": record.key, "debateId": request.debate_id, "speaker": record.speaker,
            "round": record.round, "phase": request.phase, "question": request.question,
            "prompt": request.prompt, "transcript": request.transcript,
            "deadline": iso_time(record.deadline_at)}


def turn_request_message(request: TurnRequest) -> Outgoing:
    """The turn request, ready to publish on the person's event type: ``requestId`` the turn's
    key, ``messageId`` the record's, ``correlationId`` the debate's id."""
    record = request.record
    return request_message(request.person.event_type, turn_payload(request),
                           request_id=record.key, correlation_id=request.debate_id,
                           message_id=record.message_id)


def turn_reply(event_type: str, turn_key: str, message_id: str, text: str, *,
               correlation_id: str | None = None) -> Outgoing:
    """A reply to the turn request ``message_id`` (whose ``requestId`` is ``turn_key``) on
    ``event_type``: what a person's page or any agent publishes to take the turn."""
    body = ENVELOPE_ENCODER.encode(Envelope(
        request_id=turn_key, payload={"turnKey": turn_key, "text": text},
        message_id=new_message_id(), type=completed_topic(event_type),
        correlation_id=correlation_id, causation_id=message_id, timestamp=now_iso()))
    return Outgoing(completed_topic(event_type), body, key=turn_key)


def reply_text(reply: Envelope) -> str:
    """The text a reply gives its turn. ``InputError`` when it declines the turn
    (``debateStatus: "failed"``, with ``debateError`` saying why) or carries no usable text."""
    payload = reply.payload
    if payload.get("debateStatus") == "failed":
        raise InputError(f"the turn was declined: {payload.get('debateError') or 'no reason given'}")
    text = payload.get("text")
    if not isinstance(text, str) or not text.strip():
        raise InputError("a reply to a turn request needs payload.text, a non-empty string")
    if len(text.encode()) > MAX_REPLY_BYTES:
        raise InputError(f"the reply's payload.text is over {MAX_REPLY_BYTES} bytes: shorten it")
    return text


@dataclass(frozen=True, slots=True)
class BusPeople:
    """Asks each person on ``transport``, waiting inside ``waiting()``. ``commit`` is a durable
    debate's (its checkpoint); the engine bounds the wait by the turn's deadline."""

    transport: Transport
    answers: Answers
    waiting: Callable[[], contextlib.AbstractAsyncContextManager[None]]
    commit: CommitPerson | None = None

    async def __call__(self, request: TurnRequest) -> str:
        record, event_type = request.record, request.person.event_type
        # Listening before publishing, for the reply to the very message published.
        answer = await self.answers.expect(event_type, record.key, caused_by=record.message_id)
        try:
            if self.commit is None or await self.commit(record, request.progress):
                await self.transport.publish(turn_request_message(request))
            else:  # asked by an earlier run, which may have missed the reply
                sent = await self._sent_before(event_type, record)
                if sent is not None:
                    return reply_text(sent)
            async with self.waiting():
                return reply_text(await answer)
        finally:
            self.answers.forget(event_type, record.key)

    async def _sent_before(self, event_type: str, record: HumanTurnRecord) -> Envelope | None:
        """A reply to ``record``'s request already in the broker's history, if it keeps one."""
        for topic in (completed_topic(event_type), failed_topic(event_type)):
            try:
                async for delivery in self.transport.read_range(topic):
                    with contextlib.suppress(Exception):  # another producer's message: not ours
                        reply = ENVELOPE_DECODER.decode(delivery.body)
                        if (reply.request_id == record.key
                                and reply.causation_id == record.message_id):
                            return reply
            except NotSupportedError:
                return None
        return None
