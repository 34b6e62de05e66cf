"""Settling one delivery: decode it, call its handler, publish the result and ack.

Every delivery ends settled one way: acked with its result (``event:{type}:completed`` /
``…:failed``), or dead-lettered with a reason when not even a request id can be read. A settle
the broker refuses is retried until it lands; only a lost lease, a shutdown that outlasts the
drain timeout, or a broker error inside the handler leave a delivery unsettled: it is released
(``Transport.release``), so the broker hands it out again — on Redis Streams to any consumer once
``claim_idle_ms`` has passed, on Kafka from this same consumer at once. Keeping held deliveries
alive meanwhile is the transport's job. The worker (``debatebus.worker``) owns the lifecycle.

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
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from debatebus.backoff import BROKER_BASE_S, BROKER_CAP_S, Backoff
from debatebus.client import Answers
from debatebus.engine.run import EventTypes, OnEvent
from debatebus.exceptions import InputError, LeaseLostError, MessageTooLargeError, TransportError
from debatebus.handlers.contract import Handle, Handler, HandlerContext, HandlerResult
from debatebus.handlers.results import echo, failure_fields
from debatebus.observe import Observer, Outcome, RequestContext
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
from debatebus.schemas.events import DebateEvent
from debatebus.transports import Delivery, Outgoing, Transport, dlq_topic
from debatebus.transports.dialect import DEBATEBUS_WIRE, WireDialect

__all__ = ["EVENT_ENCODER", "PAYLOAD_ECHO_LIMIT", "Route", "Settler", "bad_input", "failure_result",
           "result_message"]

log = logging.getLogger("debatebus.worker")

EVENT_ENCODER = msgspec.json.Encoder()
#: Failure events echo the request's payload up to this many bytes of JSON; above it they keep
#: only its small fields and say what was dropped (``debatePayloadTruncated``).
PAYLOAD_ECHO_LIMIT: Final = 64 * 1024
#: In a truncated echo: fields kept when their JSON is this small, up to _KEPT_BYTES in all.
_SMALL_FIELD: Final = 1024
_KEPT_BYTES: Final = 16 * 1024
_LISTED_DROPS: Final = 20
_Settled = tuple[Outcome, HandlerResult | None]
#: A request the transport's dialect leaves to another member of the fleet (it holds or answered
#: it): nothing is published; observers see it as answered elsewhere, ``replayed``.
_LEFT_ALONE: Final[_Settled] = ("replayed", None)


@dataclass(frozen=True, slots=True)
class Route:
    event_type: str
    #: As subscribed (a ``DebateHandler``, a plain function…); ``handle`` is how it is called.
    handler: Handler
    handle: Handle


@dataclass(slots=True)
class Settler:
    """What settling needs of a worker: its routes, limits, observers (``observe.fan_out``'s,
    which keeps an observer's error from reaching a settle) and event channel, and ``release``
    (stop holding a delivery, so the broker hands it out again)."""

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

    async def process(self, delivery: Delivery) -> None:
        """Settle ``delivery`` one way (answered, failed, dead-lettered, requeued), or release it
        when it cannot be settled (a lost lease, a broker error in the handler, the drain timeout)."""
        observer = self.observer
        ctx = RequestContext(delivery.topic, delivery.id, delivery.deliveries) if observer else None
        if observer is not None and ctx is not None:
            observer.request_started(ctx)
            started = time.perf_counter()
        outcome: Outcome = "unsettled"
        result: HandlerResult | None = None
        try:
            outcome, result = await self._settle(delivery, ctx)
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

    async def _requeue(self, delivery: Delivery) -> None:
        try:
            await self.transport.reject(delivery, "handler raised", requeue=True)
        except TransportError as exc:
            log.warning("could not requeue %s %s (%s): released for redelivery",
                        delivery.topic, delivery.id, exc)
            self.release(delivery)

    def _settle(self, delivery: Delivery,
                ctx: RequestContext | None) -> Coroutine[Any, Any, _Settled]:
        # Returns the coroutine of the step that settles ``delivery``, awaited by ``process``
        # with no frame of this one in between (one fewer per debate in flight).
        route = self.routes.get(delivery.topic)
        if route is None:
            return self._dead_letter(delivery, f"no handler subscribed for {delivery.topic!r}")
        if len(delivery.body) > self.max_message_bytes:
            return self._reject_or_fail(delivery, (
                f"message is {len(delivery.body)} bytes, over the limit of {self.max_message_bytes}: "
                "send a smaller message or raise max_message_bytes"))
        if delivery.deliveries > self.max_deliveries:
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
            ctx.debate_name = getattr(route.handler, "name", None)
        return self._handle(route, delivery, request, ctx)

    async def _dead_letter(self, delivery: Delivery, reason: str) -> _Settled:
        await self._retrying(delivery, "dead letter", lambda: self.transport.reject(delivery, reason))
        return "dead_lettered", None

    async def _reject_or_fail(self, delivery: Delivery, reason: str) -> _Settled:
        """A failed event when the request id can be read, the DLQ (original bytes) otherwise."""
        answer = bad_input(delivery.body, delivery.topic, reason)
        if answer is None:
            return await self._dead_letter(delivery, reason)
        if not await self.transport.dialect.claim(delivery, answer[0].request_id):
            return _LEFT_ALONE
        return await self._answer(delivery, *answer, "bad_input", None)

    async def _handle(self, route: Route, delivery: Delivery, request: Envelope,
                      ctx: RequestContext | None) -> _Settled:
        outcome: Outcome
        if not await self.transport.dialect.claim(delivery, request.request_id):
            return _LEFT_ALONE
        handling = HandlerContext(request.request_id, self._on_event(request, ctx), delivery,
                                  self.transport, self._event_types(ctx), self.answers)
        try:
            result = await route.handle(request.payload, handling)
        except InputError as exc:
            result = failure_result(request.payload, request.request_id, str(exc))
            outcome = "bad_input"
        else:
            # A stored or shared answer is a replay whatever its status (no model was called):
            # logs and metrics count what happened, once.
            outcome = ("replayed" if result.replayed else
                       "failed" if result.status == "failed" else "completed")
            result = self.transport.dialect.answered(result)
        return await self._answer(delivery, request, result, outcome, ctx)

    async def _answer(self, delivery: Delivery, request: Envelope, result: HandlerResult,
                      outcome: Outcome, ctx: RequestContext | None) -> _Settled:
        """Ack with ``result``; one the broker refuses as too large becomes a failure event."""
        try:
            await self._ack(delivery, request, result, ctx)
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
            await self._ack(delivery, request, failure, ctx)
        except MessageTooLargeError as again:
            return await self._dead_letter(delivery, (
                f"{reason}; its failure event ({again.size} bytes) was refused too"))
        return "failed", failure

    async def _ack(self, delivery: Delivery, request: Envelope, result: HandlerResult,
                   ctx: RequestContext | None) -> None:
        headers = request.headers
        if ctx is not None and self.observer is not None:
            extra = self.observer.outgoing_headers(ctx)
            headers = {**headers, **extra} if extra else headers
        out = [result_message(request, delivery.topic, result, headers,
                              dialect=self.transport.dialect, request_body=delivery.body)]
        await self._retrying(delivery, "result", lambda: self.transport.ack(delivery, out))

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

    def _on_event(self, request: Envelope, ctx: RequestContext | None) -> OnEvent | None:
        """The debate's event callback: observers see events, ``debate:events`` carries them."""
        observer = self.observer
        if not self.publish_events:
            if observer is None or ctx is None:
                return None
            return lambda event: observer.debate_event(ctx, event)
        failing = False

        async def publish(event: DebateEvent) -> None:
            nonlocal failing
            if observer is not None and ctx is not None:
                observer.debate_event(ctx, event)
            try:
                body = self.transport.dialect.event_body(
                    request.request_id, event.seq, EVENT_ENCODER.encode(event))
                await self.transport.publish(Outgoing(self.events_topic, body, key=request.request_id))
            except TransportError as exc:  # events are for watching: the debate goes on
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


def failure_result(payload: Mapping[str, Any], request_id: str, error: str, *,
                   echo_limit: int = PAYLOAD_ECHO_LIMIT) -> HandlerResult:
    """A request that failed before or instead of a debate: its payload echoed (up to
    ``echo_limit`` bytes of JSON) with the failure fields."""
    echo = _echo(payload, echo_limit)
    debate_id = echo.get("debateId")  # not when it was too big to echo
    return HandlerResult("failed", {
        **echo, **failure_fields(debate_id if isinstance(debate_id, str) else request_id, error)})


def _echo(payload: Mapping[str, Any], limit: int) -> dict[str, Any]:
    """``payload`` (its ``echo``) when its JSON fits in ``limit`` bytes; else its small fields and
    ``debatePayloadTruncated``: the payload's size, the limit, and the fields dropped."""
    size = len(EVENT_ENCODER.encode(payload))
    if size <= limit:
        return echo(payload)
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    budget = min(_KEPT_BYTES, limit // 4)
    for name, value in echo(payload).items():
        cost = len(name) + len(EVENT_ENCODER.encode(value))
        if cost <= _SMALL_FIELD and cost <= budget:
            kept[name] = value
            budget -= cost
        else:
            dropped.append(name)
    listed = [name[:64] for name in dropped[:_LISTED_DROPS]]
    return {**kept, "debatePayloadTruncated": {
        "bytes": size, "limit": limit, "dropped": listed, "droppedCount": len(dropped)}}
