"""The live debate page: a small Starlette app that follows ``debate:events`` and serves
recent debates as JSON and each debate's events as server-sent events, with the turns being
written (``turn_delta``) as ``delta`` events between them.

It keeps nothing but memory, and rebuilds it when it starts: it reads the topic's history over
the last ``catch_up_s`` seconds (24 h by default; Redis Streams and Kafka keep it, Redis pub/sub
does not), then follows it. Serve it with ``debatebus web --broker URL`` or mount
``create_app(...)`` in any ASGI server. Every request, the page's own included, must be sent to
an allowed ``Host`` and carry the token when one is set (``debatebus._access``). With
``answer_token`` (opt-in), ``POST /api/turns`` answers a person's turn request (docs/people.md),
for requests carrying that token in their header.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any, Final

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from debatebus._access import TOKEN_QUERY, Access
from debatebus._worker import EVENTS_TOPIC
from debatebus.exceptions import ConfigError, NotSupportedError
from debatebus.handlers._people import MAX_REPLY_BYTES, turn_reply
from debatebus.transports import Delivery, Transport, transport_from_url
from debatebus.web._store import DebateStore, Event

log = logging.getLogger("debatebus.web")

#: How long startup waits for the first subscription before serving anyway (healthz says 503).
STARTUP_WAIT_S: Final = 10.0
#: A comment line this often keeps proxies from closing an idle stream and notices gone clients.
KEEPALIVE_S: Final = 15.0
_RETRY_MAX_S: Final = 10.0
#: How far back the page reads the events topic when it starts.
DEFAULT_CATCH_UP_S: Final = 24 * 3600.0
#: History entries this close to the subscription's start (or after it) may come again from the
#: subscription: their ids are kept to drop the copies. Allows for the broker's clock being off.
_OVERLAP_MS: Final = 60_000
_encode = msgspec.json.Encoder().encode
#: Where a person's page answers a turn request (with ``answer_token`` only).
TURNS_PATH: Final = "/api/turns"


# ---- the page ---------------------------------------------------------------------------------


@cache
def _page() -> tuple[bytes, str]:
    """The page and a Content-Security-Policy that allows exactly its own inline script and
    style: model output that slipped past escaping could still not run."""
    html = (resources.files("debatebus.web") / "static" / "index.html").read_text("utf-8")
    hashes = {tag: [_csp_hash(body) for body in re.findall(rf"<{tag}>(.*?)</{tag}>", html, re.S)]
              for tag in ("script", "style")}
    policy = "; ".join([
        "default-src 'none'",
        "script-src " + " ".join(hashes["script"]),
        "style-src " + " ".join(hashes["style"]),
        "connect-src 'self'", "img-src 'self' data:", "base-uri 'none'", "form-action 'none'",
        "frame-ancestors 'none'",
    ])
    return html.encode(), policy


def _csp_hash(body: str) -> str:
    digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
    return f"'sha256-{digest}'"


def _json(data: Any, status: int = 200) -> Response:
    return Response(_encode(data), status, media_type="application/json",
                    headers={"Cache-Control": "no-store"})


def _sse(index: int, event: Event) -> bytes:
    # JSON never holds a raw newline, so one data line per event is enough.
    return b"id: %d\ndata: %s\n\n" % (index, _encode(event))


def _sse_delta(delta: Event) -> bytes:
    # No id: a delta is not kept, and a reconnecting page resumes after the last kept event.
    return b"event: delta\ndata: %s\n\n" % _encode(delta)


def _seconds(delivery: Delivery) -> float | None:
    return None if delivery.timestamp_ms is None else delivery.timestamp_ms / 1000.0


def _last_event_id(request: Request) -> int:
    """The index the page saw last: EventSource sends it back when it reconnects."""
    value = request.headers.get("last-event-id", "")
    return int(value) if value.isdigit() else -1


async def _close(deliveries: AsyncIterator[Delivery]) -> None:
    aclose = getattr(deliveries, "aclose", None)
    if aclose is not None:
        await aclose()


class _Guard:
    """Answers a request only when it is sent to an allowed Host and carries the token; an answer
    to a turn request, only with the answer token in its header (a link cannot answer)."""

    def __init__(self, app: ASGIApp, access: Access, answer: Access | None = None) -> None:
        self.app = app
        self.access = access
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":  # the lifespan passes; no route takes a websocket
            request = HTTPConnection(scope)
            if self.answer is not None and request.url.path == TURNS_PATH:
                refusal = self.answer.refusal(request.headers.get("host"),
                                              request.headers.get("authorization"), None)
            else:
                refusal = self.access.refusal(request.headers.get("host"),
                                              request.headers.get("authorization"),
                                              request.query_params.get(TOKEN_QUERY))
            if refusal is not None:
                headers = {"Cache-Control": "no-store", **dict(refusal.headers)}
                await PlainTextResponse(refusal.message, refusal.status, headers)(
                    scope, receive, send)
                return
        await self.app(scope, receive, send)


# ---- the app ----------------------------------------------------------------------------------


class _LivePage:
    """Follows the events topic into a DebateStore and answers the page's requests."""

    def __init__(self, broker: str | Transport, events_topic: str, history: int,
                 catch_up_s: float | None) -> None:
        self.owns_transport = isinstance(broker, str)
        self.transport = transport_from_url(broker) if isinstance(broker, str) else broker
        self.events_topic = events_topic
        self.store = DebateStore(history)
        self.catch_up_s = catch_up_s
        self.subscribed = asyncio.Event()
        self.last_error: str | None = None
        #: Messages read from the topic's history at start (None: not read yet, or no history).
        self.caught_up: int | None = None

    # -- following the bus --

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.subscribed = asyncio.Event()  # per run: an Event once awaited is tied to its loop
        pump = asyncio.create_task(self._pump(), name="debatebus-web-pump")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.subscribed.wait(), STARTUP_WAIT_S)
        try:
            yield
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            if self.owns_transport:
                await self.transport.close()

    async def _pump(self) -> None:
        """Follow the topic for as long as the app runs, re-subscribing after broker failures
        (events published meanwhile are missed: a subscription starts from now; only the first
        reads the topic's history)."""
        delay = 0.5
        while True:
            try:
                await self._follow()
                delay = 0.5
            except Exception as exc:  # any failure: a monitoring page should keep trying
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("web: following %s failed (%s); retrying in %.1fs",
                            self.events_topic, self.last_error, delay)
            self.subscribed.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX_S)

    async def _follow(self) -> None:
        await self.transport.connect()
        since_ms = int(time.time() * 1000) - _OVERLAP_MS
        deliveries = await self.transport.subscribe([self.events_topic])
        try:
            seen = await self._catch_up(since_ms) if self.caught_up is None else set()
            self.subscribed.set()
            self.last_error = None
            async for delivery in deliveries:
                if delivery.id in seen:  # read from the history already
                    seen.discard(delivery.id)
                    continue
                self.store.ingest(delivery.body, _seconds(delivery))
        finally:
            await _close(deliveries)

    async def _catch_up(self, since_ms: int) -> set[str]:
        """Read the topic's history, from ``catch_up_s`` ago, into the store; the ids of what
        was read from about the subscription's start on, which it may deliver again."""
        seen: set[str] = set()
        if self.catch_up_s == 0:
            self.caught_up = 0
            return seen
        read = 0
        try:
            async for delivery in self.transport.read_range(self.events_topic, self._start()):
                read += 1
                self.store.ingest(delivery.body, _seconds(delivery))
                if delivery.timestamp_ms is None or delivery.timestamp_ms >= since_ms:
                    seen.add(delivery.id)
        except NotSupportedError:
            log.info("web: %s keeps no history of %s: the page shows debates from its start on",
                     type(self.transport).__name__, self.events_topic)
        self.caught_up = read
        return seen

    def _start(self) -> object:
        """Where the history read starts, as the transport's ``read_range`` takes it (None:
        the topic's beginning)."""
        if self.catch_up_s is None:
            return None if self.transport.position_kind == "offset" else "-"
        since = time.time() - self.catch_up_s
        if self.transport.position_kind == "offset":  # Kafka: a record time
            return datetime.fromtimestamp(since, UTC)
        return str(int(since * 1000))  # a stream id's millisecond

    # -- routes --

    async def page(self, request: Request) -> Response:
        html, policy = _page()
        return Response(html, media_type="text/html; charset=utf-8", headers={
            "Content-Security-Policy": policy, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache",
        })

    async def healthz(self, request: Request) -> Response:
        ok = self.subscribed.is_set()
        return _json({
            "status": "ok" if ok else "unavailable", "subscribed": ok, "topic": self.events_topic,
            "debates": len(self.store), "events": self.store.received, "error": self.last_error,
            "caughtUp": self.caught_up,
        }, 200 if ok else 503)

    async def debates(self, request: Request) -> Response:
        return _json({"debates": self.store.recent()})

    async def debate(self, request: Request) -> Response:
        record = self.store.get(request.path_params["debate_id"])
        if record is None:
            return _json({"error": "no such debate (yet)"}, 404)
        return _json({"debate": record.summary(), "events": record.events})

    async def stream(self, request: Request) -> Response:
        stream = self._events(request.path_params["debate_id"], _last_event_id(request))
        return StreamingResponse(stream, media_type="text/event-stream", headers={
            "Cache-Control": "no-store", "X-Accel-Buffering": "no",
        })

    async def answer_turn(self, request: Request) -> Response:
        """Publish a person's reply to a turn request: ``{"eventType", "turnKey", "messageId",
        "text"}``, from the request's ``turn_requested`` event and what they wrote."""
        try:
            body = msgspec.json.decode(await request.body())
        except msgspec.DecodeError:
            body = None
        fields = body if isinstance(body, dict) else {}
        wanted = ("eventType", "turnKey", "messageId", "text")
        if not all(isinstance(fields.get(k), str) and fields[k].strip() for k in wanted):
            return _json({"error": "send a JSON object with eventType, turnKey and messageId (from "
                          "the turn_requested event) and text, each a non-empty string"}, 400)
        if len(fields["text"].encode()) > MAX_REPLY_BYTES:
            return _json({"error": f"text is over {MAX_REPLY_BYTES} bytes: shorten it"}, 413)
        await self.transport.publish(turn_reply(fields["eventType"], fields["turnKey"],
                                                fields["messageId"], fields["text"]))
        return _json({"published": fields["turnKey"]}, 202)

    async def _events(self, debate_id: str, after: int) -> AsyncIterator[bytes]:
        """The debate's events after index ``after``: the stored ones and the turns being
        written, then each event and delta as it arrives. The listener is registered before the
        stored events are read, so none can fall between; indexes drop the events that are in
        both, and the page the deltas (by their ``seq``)."""
        listener = self.store.listen(debate_id)
        try:
            yield b"retry: 2000\n\n"
            record = self.store.get(debate_id)
            batch: list[tuple[int | None, Event]] = []
            if record is not None:
                batch = [*enumerate(record.events), *((None, d) for d in record.typing.values())]
            while True:
                for index, event in batch:
                    if index is None:
                        yield _sse_delta(event)
                    elif index > after:
                        after = index
                        yield _sse(index, event)
                if listener.overflowed:  # the page reconnects and resumes from ``after``
                    return
                batch = await listener.next_batch(KEEPALIVE_S)
                if not batch:
                    yield b": keep-alive\n\n"
        finally:
            self.store.unlisten(debate_id, listener)


def create_app(broker_url_or_transport: str | Transport, *, history: int = 200,
               events_topic: str = EVENTS_TOPIC, token: str | None = None,
               allowed_hosts: Iterable[str] = (), answer_token: str | None = None,
               catch_up_s: float | None = DEFAULT_CATCH_UP_S) -> Starlette:
    """The live page for the debates on ``events_topic``. A transport given as an object is
    shared: it is connected but not closed by the app.

    At start it reads the topic's history from ``catch_up_s`` seconds ago (None: all of it; 0:
    none), so a restarted page still shows the debates before it (the ``history`` most recent).

    With ``token``, every request needs ``Authorization: Bearer <token>`` or ``?token=<token>``
    (a browser opens ``/?token=…`` and the page passes it on); else 401. Requests are answered
    only when their ``Host`` is loopback or in ``allowed_hosts`` (names or addresses the page is
    reached by, ``*.example.com``, ``*`` for any); else 421.

    ``answer_token`` (off by default) lets the page answer a person's turn request:
    ``POST /api/turns`` with ``Authorization: Bearer <answer_token>`` (the header only) publishes
    the reply (docs/people.md); without it there is no such route."""
    hosts = "debatebus web --allowed-host; create_app(allowed_hosts=…)"
    access = Access.of(token, allowed_hosts, host_option=hosts)
    answer = None if answer_token is None else Access.of(answer_token, allowed_hosts,
                                                         host_option=hosts)
    if catch_up_s is not None and not catch_up_s >= 0:  # also refuses NaN
        raise ConfigError(f"catch_up_s must be ≥ 0 seconds (0: read no history), or None for "
                          f"the whole topic, got {catch_up_s!r}")
    live = _LivePage(broker_url_or_transport, events_topic, history, catch_up_s)
    routes = [
        Route("/", live.page),
        Route("/healthz", live.healthz),
        Route("/api/debates", live.debates),
        Route("/api/debates/{debate_id}", live.debate),
        Route("/api/debates/{debate_id}/stream", live.stream),
    ]
    if answer is not None:
        routes.append(Route(TURNS_PATH, live.answer_turn, methods=["POST"]))
    return Starlette(routes=routes, lifespan=live.lifespan,
                     middleware=[Middleware(_Guard, access=access, answer=answer)])

