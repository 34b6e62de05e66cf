"""``DebateBus``: subscribe debate handlers to event types and serve them on a transport.

The worker decodes, calls, publishes, settles. Every handler is called one way,
``await handle(payload, ctx)`` (see ``debatebus.handlers.contract``; a plain ``async def
h(payload)`` is adapted once, at ``subscribe``). Every delivery ends settled exactly one way: acked
with its result (``event:{type}:completed`` / ``…:failed``), or dead-lettered with a reason when
not even a request id can be read. A settle the broker refuses is retried until it lands; only a
lost lease, a shutdown that outlasts the drain timeout, or a broker error inside the handler
leave a delivery unsettled: it is released (``Transport.release``), so the broker hands it out
again — on Redis Streams to any consumer once ``claim_idle_ms`` has passed, on Kafka from this
same consumer at once. Keeping held deliveries alive meanwhile is the transport's job.

Broker outages do not stop the worker: consuming and settling reconnect with capped, jittered
backoff (one WARNING when the outage starts, one INFO when it ends) while in-flight debates keep
running. Only misconfiguration (``ConfigError``: a bad URL, wrong credentials) is fatal; a broker
that cannot be reached at start-up is waited for like an outage.
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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self

import msgspec

from debatebus.backoff import Backoff
from debatebus.checkpoints.base import CheckpointStore
from debatebus.client import request_message
from debatebus.engine.run import OnEvent
from debatebus.exceptions import (
    ConfigError,
    InputError,
    LeaseLostError,
    MessageTooLargeError,
    TransportError,
)
from debatebus.handlers.contract import Handle, Handler, HandlerContext, HandlerResult, adapt
from debatebus.handlers.handler import attach_default_stores
from debatebus.handlers.results import failure_fields
from debatebus.observability.heartbeat import beat_forever, send_last_beat
from debatebus.observe import Observer, Outcome, RequestContext, fan_out
from debatebus.schemas.envelope import (
    ENVELOPE_ENCODER,
    Envelope,
    completed_topic,
    decode_request,
    failed_topic,
    lenient_request,
    now_iso,
)
from debatebus.schemas.events import DebateEvent
from debatebus.transports import (
    Delivery,
    MemoryTransport,
    Outgoing,
    Transport,
    broker_url,
    transport_from_url,
)

__all__ = ["DEFAULT_GROUP", "EVENTS_TOPIC", "PAYLOAD_ECHO_LIMIT", "DebateBus", "Handler"]

log = logging.getLogger("debatebus.worker")

DEFAULT_GROUP = "debatebus"
EVENTS_TOPIC = "debate:events"
EVENT_ENCODER = msgspec.json.Encoder()
#: Failure events echo the request's payload up to this many bytes of JSON; above it they keep
#: only its small fields and say what was dropped (``debatePayloadTruncated``).
PAYLOAD_ECHO_LIMIT: Final = 64 * 1024
_Settled = tuple[Outcome, HandlerResult | None]

#: Reconnect and settle retries wait uniformly in [0, min(cap, base × 2ⁿ)] (full jitter).
_BACKOFF_BASE_S: Final = 0.1
_BACKOFF_CAP_S: Final = 5.0
#: A consumer that reconnected and ran this long without an error ends the outage (or a delivery).
_HEALTHY_AFTER_S: Final = 1.0
#: How long a stopping worker tries to tell ``debatebus check`` so before draining anyway.
_LAST_BEAT_TIMEOUT_S: Final = 2.0
#: In a truncated echo: fields kept when their JSON is this small, up to _KEPT_BYTES in all.
_SMALL_FIELD: Final = 1024
_KEPT_BYTES: Final = 16 * 1024
_LISTED_DROPS: Final = 20


@dataclass(frozen=True, slots=True)
class _Route:
    event_type: str
    #: As subscribed (a ``DebateHandler``, a plain function…); ``handle`` is how it is called.
    handler: Handler
    handle: Handle


class _Link:
    """The worker's view of its broker: up, or in an outage (logged once each way)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.up = True
        self.backoff = Backoff(_BACKOFF_BASE_S, _BACKOFF_CAP_S)
        #: Set when the link comes back, so the heartbeat says so at once.
        self.wake = asyncio.Event()

    def lost(self, exc: TransportError, *, starting: bool = False) -> None:
        if self.up and starting:
            log.warning("cannot connect at start-up (broker %s): %s; retrying with backoff (up to "
                        "%g s) until it works or the worker is stopped", self.where, exc,
                        _BACKOFF_CAP_S)
        elif self.up:
            log.warning("lost the connection to the broker at %s: %s; reconnecting with backoff "
                        "(up to %g s), in-flight debates keep running", self.where, exc,
                        _BACKOFF_CAP_S)
        self.up = False

    def back(self) -> None:
        self.backoff.reset()
        if not self.up:
            log.info("connected to the broker at %s again", self.where)
            self.up = True
            self.wake.set()


def _where(broker: str | Transport) -> str:
    """The broker for log lines: scheme and hosts, never the userinfo or query of its URL."""
    if not isinstance(broker, str):
        return type(broker).__name__
    scheme, _, rest = broker.partition("://")
    hosts = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    return f"{scheme}://{hosts}"


def _failure(payload: Mapping[str, Any], request_id: str, error: str, *,
             echo_limit: int = PAYLOAD_ECHO_LIMIT) -> HandlerResult:
    echo = _echo(payload, echo_limit)
    debate_id = echo.get("debateId")  # not when it was too big to echo
    return HandlerResult("failed", {
        **echo, **failure_fields(debate_id if isinstance(debate_id, str) else request_id, error)})


def _echo(payload: Mapping[str, Any], limit: int) -> dict[str, Any]:
    """``payload`` when its JSON fits in ``limit`` bytes; else its small fields and
    ``debatePayloadTruncated``: the payload's size, the limit, and the fields dropped."""
    size = len(EVENT_ENCODER.encode(payload))
    if size <= limit:
        return dict(payload)
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    budget = min(_KEPT_BYTES, limit // 4)
    for name, value in payload.items():
        cost = len(name) + len(EVENT_ENCODER.encode(value))
        if cost <= _SMALL_FIELD and cost <= budget:
            kept[name] = value
            budget -= cost
        else:
            dropped.append(name)
    listed = [name[:64] for name in dropped[:_LISTED_DROPS]]
    return {**kept, "debatePayloadTruncated": {
        "bytes": size, "limit": limit, "dropped": listed, "droppedCount": len(dropped)}}


class DebateBus:
    """A worker app: ``app.subscribe("debate:request", debate.as_handler()); await app.run()``.

    ``broker``: a URL or a ``Transport``; without one, ``$DEBATEBUS_BROKER``, else
    ``redis://localhost:6379/0`` — the CLI's rule (``debatebus.transports.broker_url``)."""

    def __init__(
        self,
        broker: str | Transport | None = None,
        *,
        group: str = DEFAULT_GROUP,
        consumer: str | None = None,
        concurrency: int = 16,
        max_deliveries: int = 5,
        max_message_bytes: int = 1024 * 1024,
        publish_events: bool = False,
        events_topic: str = EVENTS_TOPIC,
        drain_timeout: float = 30.0,
        transport_options: Mapping[str, Any] | None = None,
        observers: Sequence[Observer] = (),
        heartbeat_interval_s: float | None = 5.0,
    ) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be ≥ 1, got {concurrency}")
        if max_deliveries < 1:
            raise ConfigError(f"max_deliveries must be ≥ 1, got {max_deliveries}")
        if broker is None:
            broker = broker_url()
        self.broker_url = broker if isinstance(broker, str) else type(broker).__name__
        self.transport = (
            transport_from_url(broker, **(transport_options or {})) if isinstance(broker, str) else broker
        )
        # What the default checkpoint store is chosen by; None: a transport we cannot see into.
        self._store_url = (broker if isinstance(broker, str) else
                           "memory://" if isinstance(broker, MemoryTransport) else None)
        self._where = _where(broker)
        self.group = group
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.concurrency = concurrency
        self.max_deliveries = max_deliveries
        self.max_message_bytes = max_message_bytes
        self.publish_events = publish_events
        self.events_topic = events_topic
        self.drain_timeout = drain_timeout
        self.heartbeat_interval_s = heartbeat_interval_s
        self.routes: dict[str, _Route] = {}
        self.observers = list(observers)
        self.observer = fan_out(self.observers)
        self._stop_requested = False
        self._stopping: asyncio.Event | None = None  # made on the running loop
        self._run_done: asyncio.Event | None = None
        self._link = _Link(self._where)
        self._inflight: dict[asyncio.Task[None], Delivery] = {}
        self._connected = False
        self._stores_attached = False

    # ---- definition ---------------------------------------------------------------------------

    def subscribe(self, event_type: str, handler: Handler) -> None:
        """Serve ``event_type`` with ``handler``: a ``BusHandler`` (``debate.as_handler()``),
        called as ``handle(payload, ctx)``, or a plain ``async def h(payload) -> Mapping``, whose
        ``debateStatus: "failed"`` publishes it as a failure (adapted here, once)."""
        if not event_type or not isinstance(event_type, str):
            raise ConfigError("subscribe needs an event type such as 'debate:request'")
        if event_type in self.routes:
            raise ConfigError(f"{event_type!r} already has a handler: one handler per event type")
        self.routes[event_type] = _Route(event_type, handler, adapt(handler))

    def handlers(self) -> dict[str, Handler]:
        """Each subscribed event type's handler, as given to ``subscribe``."""
        return {event_type: route.handler for event_type, route in self.routes.items()}

    def add_observer(self, observer: Observer) -> None:
        """Let ``observer`` watch this worker too (metrics, traces, logs); call before ``run``."""
        self.observers.append(observer)
        self.observer = fan_out(self.observers)

    # ---- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Connect when the broker can be reached; when it cannot, ``run`` keeps trying (and
        ``publish`` raises). Misconfiguration (``ConfigError``) raises here."""
        with contextlib.suppress(TransportError):
            await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect the transport and the handlers' checkpoint stores (durable handlers without
        one get the broker's default store first): one attempt, raising what failed."""
        if self._connected:
            return
        if not self._stores_attached:
            self._stores_attached = True
            attach_default_stores((route.handler for route in self.routes.values()), self._store_url)
        await self.transport.connect()
        for store in self._stores():
            await store.connect()
        self._connected = True

    async def close(self) -> None:
        """Close the transport and the stores. A ``run`` still going is stopped and drained
        first: nothing in flight loses its broker (Kafka commits drained offsets on close)."""
        if self._run_done is not None and not self._run_done.is_set():
            self.stop()
            await self._run_done.wait()
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
        self._stop_requested = True
        if self._stopping is not None:
            self._stopping.set()

    async def run(self) -> None:
        """Serve every subscribed event type until ``stop()``, SIGTERM or SIGINT, then drain:
        stop consuming, finish in-flight debates and their settles, and return. The transport is
        closed after that, by ``close()`` (``async with app`` does it)."""
        if not self.routes:
            raise ConfigError("no handlers: call app.subscribe('debate:request', debate.as_handler())")
        self._stopping, self._run_done = asyncio.Event(), asyncio.Event()
        self._link = _Link(self._where)
        if self._stop_requested:
            self._stopping.set()
        try:
            with self._signals():
                if await self._connect_retrying():
                    await self._serve()
        finally:
            self._stop_requested = False
            self._run_done.set()

    async def _serve(self) -> None:
        assert self._stopping is not None
        log.info("serving %s on %s as group %s (consumer %s)", ", ".join(self.routes),
                 self._where, self.group, self.consumer)
        consumer = asyncio.create_task(self._consume())
        stopper = asyncio.create_task(self._stopping.wait())
        beating = self._start_heartbeat()
        try:
            await asyncio.wait({consumer, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            failure = None if consumer.cancelled() else consumer.exception()
            await self._announce_stop(beating)
            await self._drain()  # even when consuming broke: finish what is in flight
            if failure is not None:
                raise failure
        finally:
            if beating is not None:
                beating.cancel()

    async def _connect_retrying(self) -> bool:
        """Connect, waiting out an unreachable broker or store like an outage; False when stopped
        first. A ``ConfigError`` (bad URL, wrong credentials) is raised at once."""
        while not self._stopped():
            try:
                await self.connect()
            except TransportError as exc:
                self._link.lost(exc, starting=True)
                await self._pause(self._link.backoff.next())
            else:
                self._link.back()
                return True
        return False

    def _stopped(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake up when the worker is told to stop."""
        assert self._stopping is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

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
        """Let in-flight debates and the retries of their settles finish; what can't finish in
        time is released, so the broker hands it to another worker (which resumes from its last
        checkpoint, when there is one)."""
        if not self._inflight:
            return
        _, pending = await asyncio.wait(list(self._inflight), timeout=self.drain_timeout)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("drain timeout: released %d unfinished deliveries", len(pending))
            await asyncio.wait(pending, timeout=5)

    # ---- heartbeat ----------------------------------------------------------------------------

    def _start_heartbeat(self) -> asyncio.Task[None] | None:
        if not self.heartbeat_interval_s:
            return None
        link = self._link
        return asyncio.create_task(beat_forever(
            self.transport, self.group, self.consumer, self.heartbeat_interval_s,
            lambda: len(self._inflight), connected=lambda: link.up, wake=link.wake))

    async def _announce_stop(self, beating: asyncio.Task[None] | None) -> None:
        """Stop beating and say so, so ``debatebus check`` fails within seconds of a SIGTERM."""
        if beating is None or not self.heartbeat_interval_s:
            return
        beating.cancel()
        await asyncio.gather(beating, return_exceptions=True)
        try:
            async with asyncio.timeout(_LAST_BEAT_TIMEOUT_S):
                await send_last_beat(self.transport, self.group, self.consumer,
                                     self.heartbeat_interval_s)
        except (TransportError, TimeoutError) as exc:
            log.info("could not announce the stop to health checks (the heartbeat goes stale "
                     "instead): %s", exc or "timed out")

    # ---- consuming ----------------------------------------------------------------------------

    async def _consume(self) -> None:
        """Consume until the transport closes; a broker error reconnects after a backoff. A
        ``ConfigError`` ends it (and ``run``)."""
        slots = asyncio.Semaphore(self.concurrency)
        topics = list(self.routes)
        ensured = False
        while True:
            try:
                if not ensured:
                    await self.transport.ensure_topics(topics)
                    ensured = True
                await self._take(topics, slots)
                return
            except TransportError as exc:
                self._link.lost(exc)
            await asyncio.sleep(self._link.backoff.next())

    async def _take(self, topics: list[str], slots: asyncio.Semaphore) -> None:
        """Hand each delivery of one ``consume`` stream to a task, up to ``concurrency`` at once."""
        stream = self.transport.consume(topics, group=self.group, consumer=self.consumer,
                                        prefetch=self.concurrency)
        # Without an error for a while (Kafka may deliver nothing for long), the broker is back.
        healthy = (None if self._link.up else
                   asyncio.get_running_loop().call_later(_HEALTHY_AFTER_S, self._link.back))
        try:
            async for delivery in stream:
                self._link.back()
                await slots.acquire()
                task = asyncio.create_task(self._process(delivery))
                self._inflight[task] = delivery
                task.add_done_callback(self._done)
                task.add_done_callback(lambda _: slots.release())
        finally:
            if healthy is not None:
                healthy.cancel()
            await _close_stream(stream)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.pop(task, None)

    def _release(self, delivery: Delivery) -> None:
        """Stop holding ``delivery`` (the transport stops keeping it alive) so the broker hands
        it out again."""
        task = asyncio.current_task()
        if task is not None:
            self._inflight.pop(task, None)
        self.transport.release(delivery)

    async def _process(self, delivery: Delivery) -> None:
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
            self._release(delivery)
        except TransportError as exc:  # raised in the handler: settles retry until they land
            log.error("broker error while handling %s %s: %s (released for redelivery)",
                      delivery.topic, delivery.id, exc)
            self._release(delivery)
        except asyncio.CancelledError:  # the drain timed out
            self._release(delivery)
            raise
        except Exception:
            log.exception("handler error on %s %s (requeued)", delivery.topic, delivery.id)
            await self._requeue(delivery)
        finally:
            if observer is not None and ctx is not None:
                observer.request_finished(ctx, outcome, result, time.perf_counter() - started)

    async def _requeue(self, delivery: Delivery) -> None:
        try:
            await self.transport.reject(delivery, "handler raised", requeue=True)
        except TransportError as exc:
            log.warning("could not requeue %s %s (%s): released for redelivery",
                        delivery.topic, delivery.id, exc)
            self._release(delivery)

    async def _settle(self, delivery: Delivery, ctx: RequestContext | None) -> _Settled:
        route = self.routes.get(delivery.topic)
        if route is None:
            return await self._dead_letter(delivery, f"no handler subscribed for {delivery.topic!r}")
        if len(delivery.body) > self.max_message_bytes:
            return await self._reject_or_fail(delivery, (
                f"message is {len(delivery.body)} bytes, over the limit of {self.max_message_bytes}: "
                "send a smaller message or raise max_message_bytes"))
        if delivery.deliveries > self.max_deliveries:
            return await self._dead_letter(delivery, (
                f"delivered {delivery.deliveries} times without completing (max_deliveries="
                f"{self.max_deliveries}): inspect the handler's logs for this request"))
        try:
            request = decode_request(delivery.body)
        except InputError as exc:
            return await self._reject_or_fail(delivery, str(exc))
        if ctx is not None:
            ctx.request_id, ctx.headers = request.request_id, request.headers
            ctx.debate_name = getattr(route.handler, "name", None)
        return await self._handle(route, delivery, request, ctx)

    async def _dead_letter(self, delivery: Delivery, reason: str) -> _Settled:
        await self._retrying(delivery, "dead letter", lambda: self.transport.reject(delivery, reason))
        return "dead_lettered", None

    async def _reject_or_fail(self, delivery: Delivery, reason: str) -> _Settled:
        """A failed event when the request id can be read, the DLQ (original bytes) otherwise."""
        request_id, payload = lenient_request(delivery.body)
        if request_id is None:
            return await self._dead_letter(delivery, reason)
        request = Envelope(request_id=request_id, payload=payload, type=delivery.topic)
        return await self._answer(delivery, request, _failure(payload, request_id, reason),
                                  "bad_input", None)

    async def _handle(self, route: _Route, delivery: Delivery, request: Envelope,
                      ctx: RequestContext | None) -> _Settled:
        outcome: Outcome
        handling = HandlerContext(request.request_id, self._on_event(request, ctx), delivery)
        try:
            result = await route.handle(request.payload, handling)
        except InputError as exc:
            result = _failure(request.payload, request.request_id, str(exc))
            outcome = "bad_input"
        else:
            outcome = ("failed" if result.status == "failed" else
                       "replayed" if result.replayed else "completed")
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
        failure = _failure(request.payload, request.request_id, reason,
                           echo_limit=min(PAYLOAD_ECHO_LIMIT, exc.limit // 4))
        try:
            await self._ack(delivery, request, failure, ctx)
        except MessageTooLargeError as again:
            return await self._dead_letter(delivery, (
                f"{reason}; its failure event ({again.size} bytes) was refused too"))
        return "failed", failure

    async def _ack(self, delivery: Delivery, request: Envelope, result: HandlerResult,
                   ctx: RequestContext | None) -> None:
        failed = result.status == "failed"
        topic = failed_topic(delivery.topic) if failed else completed_topic(delivery.topic)
        headers = request.headers
        if ctx is not None and self.observer is not None:
            extra = self.observer.outgoing_headers(ctx)
            headers = {**headers, **extra} if extra else headers
        body = ENVELOPE_ENCODER.encode(Envelope(
            request_id=request.request_id,
            payload=result.fields,
            type=topic,
            correlation_id=request.correlation_id or request.request_id,
            causation_id=request.request_id,
            timestamp=now_iso(),
            headers=headers,
        ))
        out = [Outgoing(topic, body, key=request.request_id)]
        await self._retrying(delivery, "result", lambda: self.transport.ack(delivery, out))

    async def _retrying(self, delivery: Delivery, what: str,
                        settle: Callable[[], Awaitable[None]]) -> None:
        """``settle`` until the broker takes it (every transport makes a repeated settle a
        no-op), with backoff; the delivery stays in flight (and the transport keeps it alive). Only the
        drain timeout ends the retries (cancelled: ``_process`` releases the delivery).
        ``MessageTooLargeError`` is raised: retrying cannot help it."""
        backoff, failures = Backoff(_BACKOFF_BASE_S, _BACKOFF_CAP_S), 0
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
                await self.transport.publish(
                    Outgoing(self.events_topic, EVENT_ENCODER.encode(event), key=request.request_id))
            except TransportError as exc:  # events are for watching: the debate goes on
                if not failing:
                    log.warning("could not publish events of %s on %s (the debate goes on): %s",
                                request.request_id, self.events_topic, exc)
                failing = True

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


async def _close_stream(stream: AsyncIterator[Delivery]) -> None:
    """End a consume stream now (an async generator's cleanup runs here, not at GC)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(TransportError):
            await aclose()
