"""Settling one delivery: decode it, call its handler, publish the result and ack.

Every delivery ends settled one way: acked with its result (``event:{type}:completed`` /
``…:failed``), or dead-lettered with a reason when not even a request id can be read. A settle
the broker refuses is retried until it lands; only a lost lease, a shutdown that outlasts the
drain timeout, or a broker error inside the handler leave a delivery unsettled: it is released
(``Transport.release``), so the broker hands it out again — on Redis Streams to any consumer once
``claim_idle_ms`` has passed, on Kafka from this same consumer at once. Keeping held deliveries
alive meanwhile is the transport's job. The worker (``debatebus._worker``) owns the lifecycle.

How often a result can reach the broker is the transport's promise (docs/durability.md): once on
Redis Streams and memory, whose ack-with-results is one atomic, repeatable step; on Kafka a
produce retried after its acknowledgement timed out, and on pub/sub a retried ack, can publish it
twice. Every copy of the answer to one request message carries the same ``messageId``
(``answer_message_id``), so consumers drop copies by it.

Where the transport's peers have rules of their own (``Transport.dialect``; Redis pub/sub speaks
Synkro's), the dialect decides whether a request is this worker's to answer at all (a copy
another member of the fleet holds or answered is left alone, nothing published), how a returned
result is published, and the bodies of results and events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import msgspec

from debatebus._backoff import BROKER_BASE_S, BROKER_CAP_S, Backoff
from debatebus.client import Answers
from debatebus.engine._run import EventTypes, OnEvent
from debatebus.exceptions import InputError, LeaseLostError, MessageTooLargeError, TransportError
from debatebus.handlers._contract import Handle, Handler, HandlerContext
from debatebus.handlers._results import PAYLOAD_ECHO_LIMIT, failure_result
from debatebus.observability._observer import Observer, RequestContext, Settlement
from debatebus.schemas.envelope import (
    Envelope,
    answer_message_id,
    completed_topic,
    decode_request,
    failed_topic,
    lenient_request,
    new_message_id,
    now_iso,
)
from debatebus.schemas.events import BusEvent, DebateEvent
from debatebus.schemas.result import HandlerResult
from debatebus.transports import Delivery, Outgoing, Transport, dlq_topic
from debatebus.transports._dialect import DEBATEBUS_WIRE, WireDialect

log = logging.getLogger("debatebus.worker")

EVENT_ENCODER = msgspec.json.Encoder()
_Settled = tuple[Settlement, HandlerResult | None]
#: A request the transport's dialect leaves to another member of the fleet (it holds or answered
#: it): nothing is published; observers see it as answered elsewhere, ``replayed``.
_LEFT_ALONE: Final[_Settled] = ("replayed", None)


@dataclass(frozen=True, slots=True)
class Route:
    event_type: str
    #: As subscribed (a ``DebateHandler``, a plain function…); ``handle`` is how it is called.
    handler: Handler
    handle: Handle


class Outlet(Protocol):
    """Where the flow sends what settles a delivery: its answer (the result message, which acks
    the delivery where the broker acks) or a dead letter (the delivery's own bytes, a reason)."""

    async def answer(self, delivery: Delivery, message: Outgoing) -> None: ...

    async def dead_letter(self, delivery: Delivery, reason: str) -> None: ...


#: Builds the context a handler is called with, for a delivery's decoded request.
MakeContext = Callable[[Envelope, Delivery, RequestContext | None], HandlerContext]


@dataclass(frozen=True, slots=True)
class Flow:
    """The settlement flow, the one way a delivery becomes an answer or a dead letter: check its
    size and delivery count, decode it, ask ``dialect`` whether it is ours, call its handler,
    and send the result through ``outlet`` (a bad input answered with a failure result when its
    request id can be read, else dead-lettered; a result the broker refuses as too large answered
    with a failure result). The worker's ``Settler`` runs it over a ``Transport``; the FastStream
    host over a framework's broker. Errors other than bad input are raised to the caller."""

    outlet: Outlet
    context: MakeContext
    dialect: WireDialect = DEBATEBUS_WIRE
    #: None: no limit (the framework hosting the handler enforces its own).
    max_message_bytes: int | None = None
    max_deliveries: int | None = None
    observer: Observer | None = None

    def settle(self, delivery: Delivery, handle: Handle | None, ctx: RequestContext | None,
               debate_name: str | None = None) -> Coroutine[Any, Any, _Settled]:
        """Settle ``delivery`` with ``handle`` (None: no handler is subscribed for its topic);
        ``debate_name``: the handler's, for ``ctx``. Returns the coroutine of the step that
        settles it, awaited by the caller with no frame of this one in between (one fewer per
        debate in flight)."""
        if handle is None:
            return self._dead_letter(delivery, f"no handler subscribed for {delivery.topic!r}")
        if self.max_message_bytes is not None and len(delivery.body) > self.max_message_bytes:
            return self._reject_or_fail(delivery, (
                f"message is {len(delivery.body)} bytes, over the limit of {self.max_message_bytes}: "
                "send a smaller message or raise max_message_bytes"))
        if self.max_deliveries is not None and delivery.deliveries > self.max_deliveries:
            return self._dead_letter(delivery, (
                f"delivered {delivery.deliveries} times without completing (max_deliveries="
                f"{self.max_deliveries}): inspect the handler's logs for this request"))
        if delivery.malformed is not None:
            return self._reject_or_fail(delivery, delivery.malformed)
        try:
            request = decode_request(delivery.body)
        except InputError as exc:
            return self._reject_or_fail(delivery, str(exc))
        if ctx is not None:
            ctx.request_id, ctx.headers = request.request_id, request.headers
            ctx.debate_name = debate_name
        return self._handle(handle, delivery, request, ctx)

    async def _dead_letter(self, delivery: Delivery, reason: str) -> _Settled:
        await self.outlet.dead_letter(delivery, reason)
        return "dead_lettered", None

    async def _reject_or_fail(self, delivery: Delivery, reason: str) -> _Settled:
        """A failed event when the request id can be read, the DLQ (original bytes) otherwise."""
        answer = bad_input(delivery.body, delivery.topic, reason)
        if answer is None:
            return await self._dead_letter(delivery, reason)
        if not await self.dialect.claim(delivery, answer[0].request_id):
            return _LEFT_ALONE
        return await self._answer(delivery, *answer, "bad_input", None)

    async def _handle(self, handle: Handle, delivery: Delivery, request: Envelope,
                      ctx: RequestContext | None) -> _Settled:
        outcome: Settlement
        if not await self.dialect.claim(delivery, request.request_id):
            return _LEFT_ALONE
        try:
            result = await handle(request.payload, self.context(request, delivery, ctx))
        except InputError as exc:
            result = failure_result(request.payload, request.request_id, str(exc))
            outcome = "bad_input"
        else:
            # A stored or shared answer is a replay whatever its status (no model was called):
            # logs and metrics count what happened, once.
            outcome = ("replayed" if result.replayed else
                       "failed" if result.status == "failed" else "completed")
            result = self.dialect.answered(result)
        return await self._answer(delivery, request, result, outcome, ctx)

    async def _answer(self, delivery: Delivery, request: Envelope, result: HandlerResult,
                      outcome: Settlement, ctx: RequestContext | None) -> _Settled:
        """Answer with ``result``; one the broker refuses as too large becomes a failure event."""
        try:
            await self._send(delivery, request, result, ctx)
        except MessageTooLargeError as exc:
            return await self._too_large(delivery, request, exc, ctx)
        return outcome, result

    async def _too_large(self, delivery: Delivery, request: Envelope, exc: MessageTooLargeError,
                         ctx: RequestContext | None) -> _Settled:
        reason = (f"result is {exc.size} bytes, over the broker's limit of {exc.limit}: ask for "
                  "less (fewer rounds, shorter answers, a smaller payload) or raise the broker's "
                  "message size limit")
        log.warning("%s %s: %s; publishing a failure event instead", delivery.topic,
                    delivery.id, reason)
        failure = failure_result(request.payload, request.request_id, reason,
                                 echo_limit=min(PAYLOAD_ECHO_LIMIT, exc.limit // 4))
        try:
            await self._send(delivery, request, failure, ctx)
        except MessageTooLargeError as again:
            return await self._dead_letter(delivery, (
                f"{reason}; its failure event ({again.size} bytes) was refused too"))
        return "failed", failure

    async def _send(self, delivery: Delivery, request: Envelope, result: HandlerResult,
                    ctx: RequestContext | None) -> None:
        headers = request.headers
        if ctx is not None and self.observer is not None:
            extra = self.observer.outgoing_headers(ctx)
            headers = {**headers, **extra} if extra else headers
        await self.outlet.answer(delivery, result_message(
            request, delivery.topic, result, headers, dialect=self.dialect,
            request_body=delivery.body))


@dataclass(slots=True)
class Settler:
    """The worker's settling: the ``Flow`` over its transport, with its routes, limits, observers
    (``observability.observer.fan_out``'s, which keeps an observer's error from reaching a
    settle) and event channel; what the flow raises is settled here (released or requeued), and
    a settle the broker refuses is retried until it lands. ``release``: stop holding a delivery,
    so the broker hands it out again."""

    transport: Transport
    routes: Mapping[str, Route]
    max_message_bytes: int
    max_deliveries: int
    observer: Observer | None
    publish_events: bool
    events_topic: str
    release: Callable[[Delivery], None]
    #: Where sub-debates wait for their children's results and persons' turns for their replies
    #: (the worker's, on ``transport``).
    answers: Answers | None = None
    flow: Flow = field(init=False)

    def __post_init__(self) -> None:
        self.flow = Flow(self, self._context, self.transport.dialect, self.max_message_bytes,
                         self.max_deliveries, self.observer)

    async def process(self, delivery: Delivery) -> None:
        """Settle ``delivery`` one way (answered, failed, dead-lettered, requeued), or release it
        when it cannot be settled (a lost lease, a broker error in the handler, the drain timeout)."""
        observer = self.observer
        ctx = RequestContext(delivery.topic, delivery.id, delivery.deliveries) if observer else None
        if observer is not None and ctx is not None:
            observer.request_started(ctx)
            started = time.perf_counter()
        outcome: Settlement = "unsettled"
        result: HandlerResult | None = None
        route = self.routes.get(delivery.topic)
        try:
            outcome, result = await self.flow.settle(
                delivery, route.handle if route is not None else None, ctx,
                getattr(route.handler, "name", None) if ctx is not None and route else None)
        except LeaseLostError as exc:
            log.warning("%s (%s %s released for redelivery)", exc, delivery.topic, delivery.id)
            self.release(delivery)
        except TransportError as exc:  # raised in the handler: settles retry until they land
            log.error("broker error while handling %s %s: %s (released for redelivery)",
                      delivery.topic, delivery.id, exc)
            self.release(delivery)
        except asyncio.CancelledError:  # the drain timed out
            self.release(delivery)
            raise
        except Exception:
            log.exception("handler error on %s %s (requeued)", delivery.topic, delivery.id)
            await self._requeue(delivery)
        finally:
            if observer is not None and ctx is not None:
                if outcome == "dead_lettered":
                    ctx.dead_letter_topic = self.transport.topic_name(dlq_topic(delivery.topic))
                observer.request_finished(ctx, outcome, result, time.perf_counter() - started)

    async def answer(self, delivery: Delivery, message: Outgoing) -> None:
        """The flow's answer: ack ``delivery`` with ``message``, retried until the broker takes it."""
        await self._retrying(delivery, "result", lambda: self.transport.ack(delivery, [message]))

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """The flow's dead letter, retried until the broker takes it."""
        await self._retrying(delivery, "dead letter",
                             lambda: self.transport.reject(delivery, reason))

    def _context(self, request: Envelope, delivery: Delivery,
                 ctx: RequestContext | None) -> HandlerContext:
        # One publisher for the debate's events and its turn deltas (``stream_turns``).
        publish = self._publisher(request) if self.publish_events else None
        return HandlerContext(request.request_id, self._on_event(publish, ctx), delivery,
                              self.transport, self._event_types(ctx), self.answers, publish)

    async def _requeue(self, delivery: Delivery) -> None:
        try:
            await self.transport.reject(delivery, "handler raised", requeue=True)
        except TransportError as exc:
            log.warning("could not requeue %s %s (%s): released for redelivery",
                        delivery.topic, delivery.id, exc)
            self.release(delivery)

    async def _retrying(self, delivery: Delivery, what: str,
                        settle: Callable[[], Awaitable[None]]) -> None:
        """``settle`` until the broker takes it, with backoff (a repeat publishes nothing new on
        Redis Streams; elsewhere a copy with the same ``messageId``: see the module docstring);
        the delivery stays in flight (and the transport keeps it alive). Only the drain timeout
        ends the retries (cancelled: ``process`` releases the delivery).
        ``MessageTooLargeError`` is raised: retrying cannot help it."""
        backoff, failures = Backoff(BROKER_BASE_S, BROKER_CAP_S), 0
        try:
            while True:
                try:
                    await settle()
                except MessageTooLargeError:
                    raise
                except TransportError as exc:
                    failures += 1
                    if failures == 1:
                        log.warning("could not settle %s %s with its %s (%s): retrying until the "
                                    "broker takes it", delivery.topic, delivery.id, what, exc)
                    await asyncio.sleep(backoff.next())
                else:
                    if failures:
                        log.info("settled %s %s with its %s after %d failed attempts",
                                 delivery.topic, delivery.id, what, failures)
                    return
        except asyncio.CancelledError:
            if failures:
                log.warning("gave up settling %s %s with its %s after %d failed attempts: released",
                            delivery.topic, delivery.id, what, failures)
            raise

    def _event_types(self, ctx: RequestContext | None) -> EventTypes:
        """The kinds of event ``_on_event``'s callback takes: every kind for ``debate:events``,
        else what the observers read."""
        if self.publish_events or self.observer is None or ctx is None:
            return None
        return self.observer.debate_event_types()

    def _on_event(self, publish: Callable[[BusEvent], Awaitable[None]] | None,
                  ctx: RequestContext | None) -> OnEvent | None:
        """The debate's event callback: observers see events, ``debate:events`` carries them
        (``publish``, when the worker publishes events)."""
        observer = self.observer
        if publish is None:
            if observer is None or ctx is None:
                return None
            return lambda event: observer.debate_event(ctx, event)

        async def watched(event: DebateEvent) -> None:
            if observer is not None and ctx is not None:
                observer.debate_event(ctx, event)
            await publish(event)

        return watched if observer is not None and ctx is not None else publish

    def _publisher(self, request: Envelope) -> Callable[[BusEvent], Awaitable[None]]:
        """Publishes one event or turn delta of ``request``'s debate on ``debate:events``; a
        broker error is logged (once per request), never raised: events are for watching."""
        failing = False

        async def publish(event: BusEvent) -> None:
            nonlocal failing
            try:
                body = self.transport.dialect.event_body(
                    request.request_id, event.seq, EVENT_ENCODER.encode(event))
                await self.transport.publish(Outgoing(self.events_topic, body, key=request.request_id))
            except TransportError as exc:  # the debate goes on
                if not failing:
                    log.warning("could not publish events of %s on %s (the debate goes on): %s",
                                request.request_id, self.events_topic, exc)
                failing = True

        return publish


def result_message(request: Envelope, event_type: str, result: HandlerResult,
                   headers: dict[str, str], *, dialect: WireDialect = DEBATEBUS_WIRE,
                   request_body: bytes = b"") -> Outgoing:
    """The message answering ``request`` (of ``event_type``) with ``result``: its envelope on
    ``event:{type}:completed``, or ``…:failed`` when the result failed, keyed by the request id;
    its body as ``dialect`` writes it (``request_body``: the request's own, which Synkro's
    failure events echo the payload of)."""
    failed = result.status == "failed"
    topic = failed_topic(event_type) if failed else completed_topic(event_type)
    body = dialect.result_body(request_body, Envelope(
        request_id=request.request_id,
        payload=result.fields,
        # The same for every copy of this answer to this request message (a retried settle, a
        # redelivery after a lost acknowledgement, a replay): consumers drop copies by messageId.
        message_id=(answer_message_id(request.message_id, topic) if request.message_id
                    else new_message_id()),
        type=topic,
        correlation_id=request.correlation_id or request.request_id,
        causation_id=request.message_id or request.request_id,  # an older producer's: no id
        timestamp=now_iso(),
        headers=headers,
    ), failed)
    return Outgoing(topic, body, key=request.request_id)


def bad_input(body: bytes, event_type: str, reason: str) -> tuple[Envelope, HandlerResult] | None:
    """What answers a request that is bad input (``reason``): its request, read leniently, and
    its failure result; None when not even a request id can be read (dead-letter it)."""
    request_id, payload = lenient_request(body)
    if request_id is None:
        return None
    request = Envelope(request_id=request_id, payload=payload, type=event_type)
    return request, failure_result(payload, request_id, reason)
