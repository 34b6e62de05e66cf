"""``DebateBus``: subscribe debate handlers to event types and serve them on a transport.

The worker owns the lifecycle: connect (waiting out an unreachable broker), consume with at most
``concurrency`` deliveries in flight, beat for ``debatebus check``, and on stop drain what is in
flight. Each delivery is settled by ``debatebus._settler`` (decode, call the handler, publish the
result and ack, exactly once). Every handler is called one way, ``await handle(payload, ctx)``
(see ``debatebus.handlers._contract``; a plain ``async def h(payload)`` is adapted once, at
``subscribe``).

Broker outages do not stop the worker: consuming and settling reconnect with capped, jittered
backoff (one WARNING when the outage starts, one INFO when it ends) while in-flight debates keep
running. Only misconfiguration (``ConfigError``: a bad URL, wrong credentials) is fatal, and a
background task of the transport that keeps failing on an error nobody expected (the Kafka fetch
loop: a ``DebatebusError`` that is no ``TransportError``, logged with its traceback where it
happened); a broker that cannot be reached at start-up is waited for like an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import signal
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Self

from debatebus._backoff import BROKER_BASE_S, BROKER_CAP_S, Backoff
from debatebus._collector import Collector
from debatebus._settler import Route, Settler
from debatebus._supervisor import supervise
from debatebus.checkpoints._base import CheckpointStore
from debatebus.client import Answers, request_message
from debatebus.exceptions import (
    ConfigError,
    TransportError,
)
from debatebus.handlers._contract import Handler, Slot, adapt, current_slot
from debatebus.handlers._handler import attach_default_stores
from debatebus.observability._heartbeat import beat_forever, send_last_beat
from debatebus.observability._observer import Observer, fan_out
from debatebus.transports import (
    Delivery,
    MemoryTransport,
    Transport,
    broker_url,
    transport_from_url,
)
from debatebus.transports._synkro import step_channel

log = logging.getLogger("debatebus.worker")

DEFAULT_GROUP = "debatebus"
#: The environment variable naming a worker's consumer when the app does not
#: (``debatebus worker --consumer`` and ``debatebus check --consumer`` default to it too).
CONSUMER_ENV: Final = "DEBATEBUS_CONSUMER"
EVENTS_TOPIC = "debate:events"
#: A consumer that reconnected and ran this long without an error ends the outage (or a delivery).
_HEALTHY_AFTER_S: Final = 1.0
#: How long a stopping worker tries to tell ``debatebus check`` so before draining anyway.
_LAST_BEAT_TIMEOUT_S: Final = 2.0


class BrokerLink:
    """The worker's view of its broker: up, or in an outage (logged once each way)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.up = True
        self.backoff = Backoff(BROKER_BASE_S, BROKER_CAP_S)
        #: Set when the link comes back, so the heartbeat says so at once.
        self.wake = asyncio.Event()

    def lost(self, exc: TransportError, *, starting: bool = False) -> None:
        if self.up and starting:
            log.warning("cannot connect at start-up (broker %s): %s; retrying with backoff (up to "
                        "%g s) until it works or the worker is stopped", self.where, exc,
                        BROKER_CAP_S)
        elif self.up:
            log.warning("lost the connection to the broker at %s: %s; reconnecting with backoff "
                        "(up to %g s), in-flight debates keep running", self.where, exc,
                        BROKER_CAP_S)
        self.up = False

    def back(self) -> None:
        self.backoff.reset()
        if not self.up:
            log.info("connected to the broker at %s again", self.where)
            self.up = True
            self.wake.set()


def broker_where(broker: str | Transport) -> str:
    """The broker for log lines: scheme and hosts, never the userinfo or query of its URL."""
    if not isinstance(broker, str):
        return type(broker).__name__
    scheme, _, rest = broker.partition("://")
    hosts = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    return f"{scheme}://{hosts}"


class DebateBus:
    """A worker app: ``app.subscribe("debate:request", debate.as_handler()); await app.run()``.

    ``broker``: a URL or a ``Transport``; without one, ``$DEBATEBUS_BROKER``, else
    ``redis://localhost:6379/0`` — the CLI's rule (``debatebus.transports.broker_url``).

    ``consumer``: this worker's name in its group (its heartbeats, ``debatebus check
    --consumer``, Redis's pending lists); without one, ``$DEBATEBUS_CONSUMER``, else
    ``{host}-{pid}-{random}``. Every live worker needs its own; a stable one (a container's
    hostname, a pod's name) lets a health check follow it across restarts."""

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
        collector: Collector | None = None,
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
        self._where = broker_where(broker)
        self.group = group
        self.consumer = (consumer or os.environ.get(CONSUMER_ENV)
                         or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        self.concurrency = concurrency
        self.max_deliveries = max_deliveries
        self.max_message_bytes = max_message_bytes
        self.publish_events = publish_events
        self.events_topic = events_topic
        self.drain_timeout = drain_timeout
        self.heartbeat_interval_s = heartbeat_interval_s
        #: Python's cyclic GC while serving (``debatebus._collector``); None: left as it is (the
        #: ``debatebus worker`` command serves with ``DEFAULT_COLLECTOR``).
        self.collector = collector
        self.routes: dict[str, Route] = {}
        self.observers = list(observers)
        self.observer = fan_out(self.observers)
        self._stop_requested = False
        self._stopping: asyncio.Event | None = None  # made on the running loop
        self._run_done: asyncio.Event | None = None
        self._link = BrokerLink(self._where)
        self._inflight: dict[asyncio.Task[None], Delivery] = {}
        self._answers = Answers(self.transport)  # children's results, persons' replies
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
        self.routes[event_type] = Route(event_type, handler, adapt(handler))

    def subscribe_synkro_step(self, workflow: str, step: str, handler: Handler) -> None:
        """Serve step ``step`` of the Synkro workflow ``workflow`` with ``handler`` (on
        ``redis+pubsub://``): Synkro's orchestrator publishes the step on
        ``workflow:<workflow>:<step>`` and reads its answer from ``event:workflow:<workflow>:
        <step>:completed`` (next step, or ``onSuccess``) or ``…:failed`` (``onFailure``), the
        result fields (``debateOutput``…) in the payload it hands the next step."""
        self.subscribe(step_channel(workflow, step), handler)

    def handlers(self) -> dict[str, Handler]:
        """Each subscribed event type's handler, as given to ``subscribe``."""
        return {event_type: route.handler for event_type, route in self.routes.items()}

    def add_observer(self, observer: Observer) -> None:
        """Let ``observer`` watch this worker too (metrics, traces, logs); call before ``run``.
        A hook that raises is logged once and ignored: it never changes how a request is settled."""
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
            await self._answers.close()
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
        self._link = BrokerLink(self._where)
        if self._stop_requested:
            self._stopping.set()
        try:
            with self._signals():
                if await self._connect_retrying():
                    with (self.collector.serving() if self.collector is not None
                          else contextlib.nullcontext()):
                        await self._serve()
        finally:
            self._stop_requested = False
            self._run_done.set()

    async def _serve(self) -> None:
        assert self._stopping is not None
        log.info("serving %s on %s as group %s (consumer %s)", ", ".join(self.routes),
                 self._where, self.group, self.consumer)
        consumer = asyncio.create_task(self._consume(self._settler()))
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
        beating = functools.partial(
            beat_forever, self.transport, self.group, self.consumer, self.heartbeat_interval_s,
            lambda: len(self._inflight), connected=lambda: link.up, wake=link.wake)
        # Given up, it leaves the heartbeat stale: what debatebus check reports.
        return asyncio.create_task(supervise("the worker's heartbeat", beating, log=log,
                                             backoff=Backoff(BROKER_BASE_S, BROKER_CAP_S)))

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

    def _settler(self) -> Settler:
        return Settler(self.transport, self.routes, self.max_message_bytes, self.max_deliveries,
                       self.observer, self.publish_events, self.events_topic, self._release,
                       self._answers)

    async def _consume(self, settler: Settler) -> None:
        """Consume until the transport closes; a broker error reconnects after a backoff. Any
        other error (a ``ConfigError``, a transport's loop given up) ends it, and ``run``."""
        slots = asyncio.Semaphore(self.concurrency)
        topics = list(self.routes)
        ensured = False
        while True:
            try:
                if not ensured:
                    await self.transport.ensure_topics(topics)
                    ensured = True
                await self._take(topics, slots, settler)
                return
            except TransportError as exc:
                self._link.lost(exc)
            await asyncio.sleep(self._link.backoff.next())

    async def _take(self, topics: list[str], slots: asyncio.Semaphore, settler: Settler) -> None:
        """Hand each delivery of one ``consume`` stream to a task, up to ``concurrency`` at once."""
        stream = self.transport.consume(topics, group=self.group, consumer=self.consumer,
                                        prefetch=self.concurrency)
        # Without an error for a while (Kafka may deliver nothing for long), the broker is back.
        healthy = (None if self._link.up else
                   asyncio.get_running_loop().call_later(_HEALTHY_AFTER_S, self._link.back))
        try:
            while True:
                # A free slot first, then a delivery, so none is taken (and counted as delivered)
                # ahead of a slot to run it. The slot is not held while the read waits: a handler
                # that lent its slot out (a parent waiting for its sub-debates) takes it back.
                if slots.locked():
                    await slots.acquire()
                    slots.release()
                try:
                    delivery = await anext(stream)
                except StopAsyncIteration:
                    return
                await slots.acquire()
                self._link.back()
                # The task's own slot, which its handler may lend out while it waits (ctx.waiting).
                slot, context = Slot(slots, self.transport, delivery), contextvars.copy_context()
                context.run(current_slot.set, slot)
                task = asyncio.create_task(settler.process(delivery), context=context)
                self._inflight[task] = delivery
                task.add_done_callback(self._finished(slot))
        finally:
            if healthy is not None:
                healthy.cancel()
            await _close_stream(stream)

    def _finished(self, slot: Slot) -> Callable[[asyncio.Task[None]], None]:
        """The task's one done callback (one closure, not two callbacks: each debate in flight
        keeps it): forget the task, and give ``slot`` back unless the task had lent it out and
        not retaken it."""

        def done(task: asyncio.Task[None]) -> None:
            self._inflight.pop(task, None)
            slot.release()

        return done

    def _release(self, delivery: Delivery) -> None:
        """Stop holding ``delivery`` (the transport stops keeping it alive) so the broker hands
        it out again."""
        task = asyncio.current_task()
        if task is not None:
            self._inflight.pop(task, None)
        self.transport.release(delivery)

    # ---- producing ----------------------------------------------------------------------------

    async def publish(self, event_type: str, payload: Mapping[str, Any], *,
                      request_id: str | None = None, correlation_id: str | None = None,
                      causation_id: str | None = None,
                      headers: Mapping[str, str] | None = None) -> str:
        """Publish a request envelope (see ``client.request_message``); returns its requestId."""
        await self.connect()
        message = request_message(event_type, payload, request_id=request_id,
                                  correlation_id=correlation_id, causation_id=causation_id,
                                  headers=headers)
        await self.transport.publish(message)
        return str(message.key)


async def _close_stream(stream: AsyncIterator[Delivery]) -> None:
    """End a consume stream now (an async generator's cleanup runs here, not at GC)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(TransportError):
            await aclose()
