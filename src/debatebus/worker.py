"""``DebateBus``: subscribe debate handlers to event types and serve them on a transport.

The worker decodes, calls, publishes, settles. Every delivery ends settled exactly one way: acked
with its result (``event:{type}:completed`` / ``…:failed``), or dead-lettered with a reason when
not even a request id can be read, or left unsettled for redelivery when the broker fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import msgspec

from debatebus.checkpoints.base import CheckpointStore
from debatebus.client import request_message
from debatebus.engine.run import OnEvent
from debatebus.exceptions import ConfigError, InputError, LeaseLostError, TransportError
from debatebus.observability.heartbeat import beat_forever
from debatebus.observe import Observer, Outcome, RequestContext, fan_out
from debatebus.schemas.envelope import (
    ENVELOPE_DECODER,
    ENVELOPE_ENCODER,
    Envelope,
    completed_topic,
    failed_topic,
    lenient_request,
    now_iso,
)
from debatebus.schemas.events import DebateEvent
from debatebus.schemas.results import failure_fields
from debatebus.transports import Delivery, Outgoing, Transport, transport_from_url

__all__ = ["DEFAULT_GROUP", "EVENTS_TOPIC", "DebateBus", "Handler"]

log = logging.getLogger("debatebus.worker")

DEFAULT_GROUP = "debatebus"
EVENTS_TOPIC = "debate:events"
EVENT_ENCODER = msgspec.json.Encoder()
Handler = Callable[..., Awaitable[Mapping[str, Any]]]
_Settled = tuple[Outcome, Mapping[str, Any] | None]


@dataclass(frozen=True, slots=True)
class _Route:
    event_type: str
    handler: Handler
    accepts_context: bool


def _accepts_context(handler: Handler) -> bool:
    """Our DebateHandler takes request_id/on_event; a plain ``async def h(payload)`` does not."""
    from debatebus.handlers.handler import DebateHandler

    return isinstance(handler, DebateHandler)


def _failure_payload(payload: Mapping[str, Any], request_id: str, error: str) -> dict[str, Any]:
    debate_id = payload.get("debateId")
    return {**payload, **failure_fields(debate_id if isinstance(debate_id, str) else request_id,
                                        error)}


class DebateBus:
    """A worker app: ``app.subscribe("debate:request", debate.as_handler()); await app.run()``."""

    def __init__(
        self,
        broker: str | Transport = "memory://",
        *,
        group: str = DEFAULT_GROUP,
        consumer: str | None = None,
        concurrency: int = 16,
        max_deliveries: int = 5,
        max_message_bytes: int = 1024 * 1024,
        publish_events: bool = False,
        events_topic: str = EVENTS_TOPIC,
        drain_timeout: float = 30.0,
        touch_interval_s: float = 10.0,
        transport_options: Mapping[str, Any] | None = None,
        observers: Sequence[Observer] = (),
        heartbeat_interval_s: float | None = 5.0,
    ) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be ≥ 1, got {concurrency}")
        if max_deliveries < 1:
            raise ConfigError(f"max_deliveries must be ≥ 1, got {max_deliveries}")
        self.broker_url = broker if isinstance(broker, str) else type(broker).__name__
        self.transport = (
            transport_from_url(broker, **(transport_options or {})) if isinstance(broker, str) else broker
        )
        self.group = group
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.concurrency = concurrency
        self.max_deliveries = max_deliveries
        self.max_message_bytes = max_message_bytes
        self.publish_events = publish_events
        self.events_topic = events_topic
        self.drain_timeout = drain_timeout
        self.touch_interval_s = touch_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.routes: dict[str, _Route] = {}
        self.observers = list(observers)
        self.observer = fan_out(self.observers)
        self._stopping: asyncio.Event | None = None  # made on the running loop
        self._inflight: dict[asyncio.Task[None], Delivery] = {}
        self._connected = False

    # ---- definition ---------------------------------------------------------------------------

    def subscribe(self, event_type: str, handler: Handler) -> None:
        if not event_type or not isinstance(event_type, str):
            raise ConfigError("subscribe needs an event type such as 'debate:request'")
        if event_type in self.routes:
            raise ConfigError(f"{event_type!r} already has a handler: one handler per event type")
        if not callable(handler):
            raise ConfigError(f"handler for {event_type!r} must be an async callable, got {handler!r}")
        self.routes[event_type] = _Route(event_type, handler, _accepts_context(handler))

    def add_observer(self, observer: Observer) -> None:
        """Let ``observer`` watch this worker too (metrics, traces, logs); call before ``run``."""
        self.observers.append(observer)
        self.observer = fan_out(self.observers)

    # ---- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect the transport and the handlers' checkpoint stores: an unreachable store fails
        the worker at startup, not its first debate."""
        if not self._connected:
            await self.transport.connect()
            for store in self._stores():
                await store.connect()
            self._connected = True

    async def close(self) -> None:
        if self._connected:
            self._connected = False
            await self.transport.close()
            for store in self._stores():
                await store.close()

    def _stores(self) -> list[CheckpointStore]:
        stores = (getattr(route.handler, "store", None) for route in self.routes.values())
        return list({id(s): s for s in stores if isinstance(s, CheckpointStore)}.values())

    def stop(self) -> None:
        """Stop taking new work; in-flight debates drain (``run`` returns when they're done)."""
        if self._stopping is not None:
            self._stopping.set()

    async def run(self) -> None:
        """Serve every subscribed event type until ``stop()``, SIGTERM or SIGINT, then drain."""
        if not self.routes:
            raise ConfigError("no handlers: call app.subscribe('debate:request', debate.as_handler())")
        self._stopping = asyncio.Event()
        await self.connect()
        await self.transport.ensure_topics(list(self.routes))
        with self._signals():
            consumer = asyncio.create_task(self._consume())
            stopper = asyncio.create_task(self._stopping.wait())
            background = [asyncio.create_task(self._touch_forever())]
            if self.heartbeat_interval_s:
                background.append(asyncio.create_task(beat_forever(
                    self.transport, self.group, self.consumer, self.heartbeat_interval_s,
                    lambda: len(self._inflight))))
            try:
                await asyncio.wait({consumer, stopper}, return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
                consumer.cancel()
                await asyncio.gather(consumer, return_exceptions=True)
                failure = None if consumer.cancelled() else consumer.exception()
                await self._drain()  # even when consuming broke: finish what is in flight
                if failure is not None:
                    raise failure
            finally:
                for task in background:
                    task.cancel()

    @contextlib.contextmanager
    def _signals(self) -> Any:
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
        try:
            yield
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("received %s: draining %d in-flight debates", sig.name, len(self._inflight))
        self.stop()

    async def _drain(self) -> None:
        """Let in-flight debates finish; what can't finish in time stays unsettled, so the broker
        hands it to another worker (which resumes from its last checkpoint, when there is one)."""
        if not self._inflight:
            return
        _, pending = await asyncio.wait(list(self._inflight), timeout=self.drain_timeout)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("drain timeout: handed back %d unfinished debates", len(pending))
            await asyncio.wait(pending, timeout=5)

    # ---- consuming ----------------------------------------------------------------------------

    async def _consume(self) -> None:
        slots = asyncio.Semaphore(self.concurrency)
        stream = self.transport.consume(
            list(self.routes), group=self.group, consumer=self.consumer, prefetch=self.concurrency
        )
        async for delivery in stream:
            await slots.acquire()
            task = asyncio.create_task(self._process(delivery))
            self._inflight[task] = delivery
            task.add_done_callback(self._done)
            task.add_done_callback(lambda _: slots.release())

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.pop(task, None)

    async def _touch_forever(self) -> None:
        """Keep long debates' deliveries alive at the broker while this worker is."""
        while True:
            await asyncio.sleep(self.touch_interval_s)
            if self._inflight:
                try:
                    await self.transport.touch(list(self._inflight.values()))
                except TransportError as exc:
                    log.warning("could not touch in-flight deliveries: %s", exc)

    async def _process(self, delivery: Delivery) -> None:
        observer = self.observer
        ctx = RequestContext(delivery.topic, delivery.id, delivery.deliveries) if observer else None
        if observer is not None and ctx is not None:
            observer.request_started(ctx)
            started = time.perf_counter()
        outcome: Outcome = "unsettled"
        result: Mapping[str, Any] | None = None
        try:
            outcome, result = await self._settle(delivery, ctx)
        except LeaseLostError as exc:
            log.warning("%s (%s %s left for redelivery)", exc, delivery.topic, delivery.id)
        except TransportError as exc:
            log.error("broker error while settling %s %s: %s (left for redelivery)",
                      delivery.topic, delivery.id, exc)
        except Exception:
            log.exception("handler error on %s %s (left for redelivery)", delivery.topic, delivery.id)
            with contextlib.suppress(TransportError):
                await self.transport.reject(delivery, "handler raised", requeue=True)
        finally:
            if observer is not None and ctx is not None:
                observer.request_finished(ctx, outcome, result, time.perf_counter() - started)

    async def _settle(self, delivery: Delivery, ctx: RequestContext | None) -> _Settled:
        route = self.routes.get(delivery.topic)
        if route is None:
            await self.transport.reject(delivery, f"no handler subscribed for {delivery.topic!r}")
            return "dead_lettered", None
        if len(delivery.body) > self.max_message_bytes:
            return await self._reject_or_fail(delivery, (
                f"message is {len(delivery.body)} bytes, over the limit of {self.max_message_bytes}: "
                "send a smaller message or raise max_message_bytes"))
        if delivery.deliveries > self.max_deliveries:
            await self.transport.reject(delivery, (
                f"delivered {delivery.deliveries} times without completing (max_deliveries="
                f"{self.max_deliveries}): inspect the handler's logs for this request"))
            return "dead_lettered", None
        try:
            request = ENVELOPE_DECODER.decode(delivery.body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return await self._reject_or_fail(delivery, _decode_reason(exc))
        if ctx is not None:
            ctx.request_id, ctx.headers = request.request_id, request.headers
            ctx.debate_name = getattr(route.handler, "name", None)
        return await self._handle(route, delivery, request, ctx)

    async def _reject_or_fail(self, delivery: Delivery, reason: str) -> _Settled:
        """A failed event when the request id can be read, the DLQ (original bytes) otherwise."""
        request_id, payload = lenient_request(delivery.body)
        if request_id is None:
            await self.transport.reject(delivery, reason)
            return "dead_lettered", None
        request = Envelope(request_id=request_id, payload=payload, type=delivery.topic)
        result = _failure_payload(payload, request_id, reason)
        await self._ack(delivery, request, result, "failed", None)
        return "bad_input", result

    async def _handle(self, route: _Route, delivery: Delivery, request: Envelope,
                      ctx: RequestContext | None) -> _Settled:
        outcome: Outcome
        try:
            if route.accepts_context:
                result = await route.handler(request.payload, request_id=request.request_id,
                                             on_event=self._on_event(request, ctx))
            else:
                result = await route.handler(request.payload)
        except InputError as exc:
            result = _failure_payload(request.payload, request.request_id, str(exc))
            outcome = "bad_input"
        else:
            failed = result.get("debateStatus") == "failed"
            outcome = "failed" if failed else "replayed" if result.get("debateReplayed") else "completed"
        status = "failed" if result.get("debateStatus") == "failed" else "completed"
        await self._ack(delivery, request, result, status, ctx)
        return outcome, result

    async def _ack(self, delivery: Delivery, request: Envelope, result: Mapping[str, Any],
                   status: str, ctx: RequestContext | None) -> None:
        topic = completed_topic(delivery.topic) if status == "completed" else failed_topic(delivery.topic)
        headers = request.headers
        if ctx is not None and self.observer is not None:
            extra = self.observer.outgoing_headers(ctx)
            headers = {**headers, **extra} if extra else headers
        body = ENVELOPE_ENCODER.encode(Envelope(
            request_id=request.request_id,
            payload=dict(result),
            type=topic,
            correlation_id=request.correlation_id or request.request_id,
            causation_id=request.request_id,
            timestamp=now_iso(),
            headers=headers,
        ))
        await self.transport.ack(delivery, [Outgoing(topic, body, key=request.request_id)])

    def _on_event(self, request: Envelope, ctx: RequestContext | None) -> OnEvent | None:
        """The debate's event callback: observers see events, ``debate:events`` carries them."""
        observer = self.observer
        if not self.publish_events:
            if observer is None or ctx is None:
                return None
            return lambda event: observer.debate_event(ctx, event)

        async def publish(event: DebateEvent) -> None:
            if observer is not None and ctx is not None:
                observer.debate_event(ctx, event)
            await self.transport.publish(
                Outgoing(self.events_topic, EVENT_ENCODER.encode(event), key=request.request_id)
            )

        return publish

    # ---- producing ----------------------------------------------------------------------------

    async def publish(self, event_type: str, payload: Mapping[str, Any], *,
                      request_id: str | None = None, correlation_id: str | None = None,
                      headers: Mapping[str, str] | None = None) -> str:
        """Publish a request envelope; returns its requestId."""
        await self.connect()
        message = request_message(event_type, payload, request_id=request_id,
                                  correlation_id=correlation_id, headers=headers)
        await self.transport.publish(message)
        return str(message.key)


def _decode_reason(exc: Exception) -> str:
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        return (f"envelope does not match the schema ({text}): send "
                '{"requestId": "<id>", "payload": {"input": "<topic>"}}')
    return f"body is not valid JSON ({text}): send a UTF-8 JSON envelope"
