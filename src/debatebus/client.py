"""Calling debates from Python over the bus: publish a request and wait for its result, or follow
its debate's events and turn deltas as they come (``BusClient.stream``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any, Final, Self

import msgspec

from debatebus._redaction import redact
from debatebus._supervisor import supervise
from debatebus.exceptions import TransportError
from debatebus.observability._tracing import inject_traceparent
from debatebus.schemas.envelope import (
    ENVELOPE_DECODER,
    ENVELOPE_ENCODER,
    Envelope,
    completed_topic,
    failed_topic,
    new_message_id,
    now_iso,
)
from debatebus.schemas.events import (
    BUS_EVENT_DECODER,
    BusEvent,
    DebateCompleted,
    DebateFailed,
    DebateStarted,
)
from debatebus.transports import Delivery, Outgoing, Transport, broker_url, transport_from_url

__all__ = ["EVENTS_GRACE_S", "Answers", "BusClient", "RequestStream", "request_message"]

#: How long a stream waits, once the result is in, for the debate's last event to arrive (it was
#: published first, but on another topic, read by another subscription).
EVENTS_GRACE_S: Final = 2.0

log = logging.getLogger("debatebus.client")


class BusClient:
    """``async with BusClient(url) as c: result = await c.request("debate:request", {"input": …})``.

    Without ``broker``: ``$DEBATEBUS_BROKER``, else ``redis://localhost:6379/0`` (``broker_url``).
    The first request of an event type subscribes to its results, and every later one shares
    that subscription until the client closes (or the subscription fails: then the next request
    subscribes anew)."""

    def __init__(self, broker: str | Transport | None = None, **transport_options: Any) -> None:
        self.transport = (
            broker if isinstance(broker, Transport)
            else transport_from_url(broker_url(broker), **transport_options)
        )
        self._answers = Answers(self.transport)

    async def __aenter__(self) -> Self:
        await self.transport.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._answers.close()
        await self.transport.close()

    async def publish(self, event_type: str, payload: Mapping[str, Any], *,
                      request_id: str | None = None, correlation_id: str | None = None,
                      causation_id: str | None = None,
                      headers: Mapping[str, str] | None = None) -> str:
        """Publish a request envelope (see ``request_message``); returns its requestId."""
        message = request_message(event_type, payload, request_id=request_id,
                                  correlation_id=correlation_id, causation_id=causation_id,
                                  headers=headers)
        await self.transport.publish(message)
        return str(message.key)

    async def results(self, event_type: str) -> AsyncIterator[Envelope]:
        """Every result (completed or failed) of ``event_type`` published after this returns."""
        return _decoded(await self.transport.subscribe(_result_topics(event_type)))

    async def request(self, event_type: str, payload: Mapping[str, Any], *,
                      request_id: str | None = None, timeout: float = 300.0,
                      correlation_id: str | None = None,
                      headers: Mapping[str, str] | None = None) -> Envelope:
        """Publish a request and return its result envelope (``payload["debateStatus"]``)."""
        rid = request_id or uuid.uuid4().hex
        try:
            answer = await self._answers.expect(event_type, rid)  # listening before we publish
            await self.publish(event_type, payload, request_id=rid, correlation_id=correlation_id,
                               headers=headers)
            async with asyncio.timeout(timeout):
                return await answer
        except TimeoutError:
            raise TransportError(
                f"no result for request {rid} on {completed_topic(event_type)} within {timeout} s: "
                f"is a worker subscribed to {event_type!r} on this broker?"
            ) from None
        finally:
            self._answers.forget(event_type, rid)

    async def stream(self, event_type: str, payload: Mapping[str, Any], *,
                     request_id: str | None = None, timeout: float = 300.0,
                     events_topic: str = "debate:events", correlation_id: str | None = None,
                     headers: Mapping[str, str] | None = None) -> RequestStream:
        """Publish a request and follow it: ``async for event in stream`` gives its debate's
        events and turn deltas (``TurnDelta``, from a handler made with ``stream_turns=True``)
        from ``events_topic`` (the worker's ``events_topic``; it needs ``publish_events=True``),
        in order, and ends once its result is in: then ``stream.result`` is the result envelope,
        as ``request`` returns it. ``TransportError`` when no result comes within ``timeout``.
        Use it in ``async with`` (or call ``aclose()``): its subscriptions end there.

        A request answered without a run (a stored result replayed, bad input) has no events:
        the stream ends with its result at once."""
        rid = request_id or uuid.uuid4().hex
        events = await self.transport.subscribe([events_topic])
        try:
            answer = await self._answers.expect(event_type, rid)  # listening before we publish
        except BaseException:
            self._answers.forget(event_type, rid)
            await _close(events)
            raise
        followed = RequestStream(self._answers, event_type, rid, events, answer, timeout)
        try:
            await self.publish(event_type, payload, request_id=rid,
                               correlation_id=correlation_id, headers=headers)
        except BaseException:
            await followed.aclose()
            raise
        return followed


class RequestStream:
    """One request's debate events and turn deltas as they come, then its result
    (``BusClient.stream``)."""

    def __init__(self, answers: Answers, event_type: str, request_id: str,
                 events: AsyncIterator[Delivery], answer: asyncio.Future[Envelope],
                 timeout: float) -> None:
        self.request_id = request_id
        #: The result envelope, once the stream has ended.
        self.result: Envelope | None = None
        self._answers = answers
        self._event_type = event_type
        self._events = events
        self._answer = answer
        self._deadline = asyncio.get_running_loop().time() + timeout
        self._grace_end = self._deadline  # set when the result is in
        self._timeout = timeout
        self._arrived: asyncio.Queue[BusEvent | None] = asyncio.Queue()
        self._pump = asyncio.create_task(self._read())
        answer.add_done_callback(lambda _: self._arrived.put_nowait(None))
        self._started = False  # its debate's first event was seen
        self._finished = False  # and its last
        self._closed = False

    async def _read(self) -> None:
        """Hand on the request's events. Should the subscription fail, the events stop there
        (they are for watching) and the stream still ends with the result."""
        with contextlib.suppress(TransportError):
            async for delivery in self._events:
                try:
                    event = BUS_EVENT_DECODER.decode(delivery.body)
                except msgspec.DecodeError:
                    continue  # not an event of debatebus's own wire
                if event.request_id == self.request_id:
                    self._arrived.put_nowait(event)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> BusEvent:
        loop = asyncio.get_running_loop()
        while not self._closed:
            grace = self._grace_end if self._answer.done() else self._deadline
            try:
                async with asyncio.timeout_at(grace):
                    item = await self._arrived.get()
            except TimeoutError:
                if not self._answer.done():
                    await self.aclose()
                    raise TransportError(
                        f"no result for request {self.request_id} within {self._timeout} s: is "
                        f"a worker subscribed to {self._event_type!r} on this broker?") from None
                break  # the result is in; its last event never came (events not published?)
            if item is None:  # the result is in
                self.result = self._answer.result()
                self._grace_end = loop.time() + (EVENTS_GRACE_S if self._ran() else 0.0)
                if self._finished or not self._ran():
                    break
                continue
            if item.depth == 0:
                self._started = self._started or isinstance(item, DebateStarted)
                self._finished = isinstance(item, DebateCompleted | DebateFailed)
            return item
        await self.aclose()
        raise StopAsyncIteration

    def _ran(self) -> bool:
        """Whether a debate ran for this answer: it has events to wait for."""
        assert self.result is not None
        fields = self.result.payload
        return self._started or (fields.get("debateReplayed") is not True
                                 and "debateDurationMs" in fields)

    async def aclose(self) -> None:
        """End the subscriptions (the stream ends with them)."""
        if self._closed:
            return
        self._closed = True
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump
        self._answers.forget(self._event_type, self.request_id)
        await _close(self._events)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


async def _close(deliveries: AsyncIterator[Delivery]) -> None:
    aclose = getattr(deliveries, "aclose", None)
    if aclose is not None:
        await aclose()


class Answers:
    """The results of requests published on ``transport``, handed out by request id: one
    subscription per event type, made by the first wait and shared by every later one until
    ``close`` (or until it fails: the next wait subscribes anew). What ``BusClient.request`` and
    a worker's sub-debates wait with."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._listeners: dict[str, _Listener] = {}

    async def expect(self, event_type: str, request_id: str, *,
                     caused_by: str | None = None) -> asyncio.Future[Envelope]:
        """The future of ``request_id``'s result, once its event type's results are followed
        (publish the request after this returns); ``forget`` it when done waiting.
        ``caused_by``: only a result whose ``causationId`` is this ``messageId`` (the request
        message published) answers; any other result under the same request id is passed over."""
        listener = self._listeners.get(event_type)
        if listener is None or listener.closed:
            listener = self._listeners[event_type] = _Listener(self._transport, event_type)
        return await listener.expect(request_id, caused_by)

    def forget(self, event_type: str, request_id: str) -> None:
        listener = self._listeners.get(event_type)
        if listener is not None:
            listener.waiting.pop(request_id, None)
            listener.causes.pop(request_id, None)

    async def close(self) -> None:
        listeners, self._listeners = self._listeners, {}
        for listener in listeners.values():
            await listener.close()


class _Listener:
    """One subscription to an event type's results, handing each to the request waiting for its
    id. (A subscription per request took a connection each: more requests waiting at once than
    the connection pool holds failed. One per burst of requests was cut off mid-read when the
    burst ended, and Redis's connection with it: a reconnect per burst.)"""

    def __init__(self, transport: Transport, event_type: str) -> None:
        self.event_type = event_type
        self.topics = _result_topics(event_type)
        self.waiting: dict[str, asyncio.Future[Envelope]] = {}
        #: The messageId a waiter's result must be caused by, for the waiters that ask so.
        self.causes: dict[str, str] = {}
        self.closed = False
        self._subscribed = asyncio.ensure_future(transport.subscribe(self.topics))
        self._task: asyncio.Task[None] | None = None

    async def expect(self, rid: str, caused_by: str | None = None) -> asyncio.Future[Envelope]:
        """The future of ``rid``'s result (caused by ``caused_by``, when given), once the
        subscription listens."""
        future = self.waiting[rid] = asyncio.get_running_loop().create_future()
        if caused_by is not None:
            self.causes[rid] = caused_by
        try:
            subscription = await asyncio.shield(self._subscribed)
        except TransportError:
            self.closed = True  # the next request subscribes anew
            raise
        if self._task is None:
            self._task = asyncio.create_task(supervise(
                f"the result listener for {self.event_type}",
                functools.partial(self._hand_out, subscription), log=log, died=self._died))
        return future

    async def close(self) -> None:
        self.closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self._subscribed.done():
            self._subscribed.cancel()
        elif not self._subscribed.cancelled() and self._subscribed.exception() is None:
            await self._subscribed.result().aclose()  # type: ignore[attr-defined]

    async def _hand_out(self, subscription: AsyncIterator[Delivery]) -> None:
        """Hand each result to its waiter until the subscription ends or fails; anything else
        it raises is ``supervise``'s (``_died``)."""
        error = TransportError(f"the subscription to {self.topics} ended")
        try:
            async for delivery in subscription:
                envelope = _decode(delivery)
                if envelope is None:
                    continue
                rid = envelope.request_id
                future = self.waiting.get(rid)
                if future is not None and not future.done() and (
                        rid not in self.causes or envelope.causation_id == self.causes[rid]):
                    future.set_result(envelope)
        except TransportError as exc:
            error = exc
        self._fail(error)

    def _died(self, exc: Exception) -> None:
        self._fail(TransportError(f"the result listener for {self.event_type} stopped: "
                                   f"{redact(repr(exc))}"))

    def _fail(self, error: TransportError) -> None:
        """Wake every waiter with ``error``; the next request subscribes anew."""
        self.closed = True
        for rid, future in self.waiting.items():
            if not future.done():
                future.set_exception(TransportError(f"{error} before request {rid} was answered"))


def _result_topics(event_type: str) -> list[str]:
    return [completed_topic(event_type), failed_topic(event_type)]


def request_message(event_type: str, payload: Mapping[str, Any], *, request_id: str | None = None,
                    correlation_id: str | None = None, causation_id: str | None = None,
                    headers: Mapping[str, str] | None = None,
                    message_id: str | None = None) -> Outgoing:
    """A request envelope with a fresh ``messageId``, ready to publish, carrying the current trace
    context when there is one. A service that publishes because of a message (a hop of a chain)
    passes that message's ``messageId`` as ``causation_id`` and its ``correlationId`` on.
    ``message_id``: the message's own id, when the caller must know it first (else a fresh one)."""
    rid = request_id or uuid.uuid4().hex
    body = ENVELOPE_ENCODER.encode(Envelope(
        request_id=rid, payload=dict(payload), message_id=message_id or new_message_id(),
        type=event_type,
        correlation_id=correlation_id, causation_id=causation_id, timestamp=now_iso(),
        headers=inject_traceparent(headers)))
    return Outgoing(event_type, body, key=rid)


async def _decoded(deliveries: AsyncIterator[Delivery]) -> AsyncIterator[Envelope]:
    async for delivery in deliveries:
        envelope = _decode(delivery)
        if envelope is not None:
            yield envelope


def _decode(delivery: Delivery) -> Envelope | None:
    try:
        return ENVELOPE_DECODER.decode(delivery.body)
    except Exception:  # someone else's message on a result topic: not ours to judge
        return None
