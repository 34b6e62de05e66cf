"""Prometheus metrics of a worker: ``app.add_observer(PrometheusObserver())`` then
``start_metrics_server(9108)`` (or ``debatebus worker … --metrics-port 9108``), which serves
``http://127.0.0.1:9108/metrics`` unless given another host, with a bearer token when given one
(``debatebus._access``).

Every metric is named ``{namespace}_…`` with base units (seconds) and ``_total`` on counters.
Debate lifecycle metrics are labelled by ``event_type`` (the request topic, e.g.
``debate:request``); LLM metrics by participant, model, purpose (framing, turn, judge, synthesis).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

try:
    from prometheus_client import (
        REGISTRY,
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        Summary,
        make_wsgi_app,
    )
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "Prometheus metrics need prometheus-client: pip install 'debatebus[metrics]'"
    ) from exc

from debatebus._access import TOKEN_QUERY, Access, is_loopback, warn_if_exposed
from debatebus.observability._events import CALL_PURPOSES, CallEvent, model_of
from debatebus.observability._observer import Observer, RequestContext, Settlement
from debatebus.schemas import events as ev
from debatebus.schemas.result import HandlerResult

log = logging.getLogger("debatebus.metrics")

#: Debates take seconds (fakes, small models) to tens of minutes (long protocols on big models).
DEBATE_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)
CALL_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
#: Most asks for rate-limit budget are granted at once; a saturated limit makes calls wait seconds.
WAIT_BUCKETS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BY_TYPE = ("event_type",)


class PrometheusObserver(Observer):
    """Counts what a worker does into ``registry`` (the process-wide default when None).

    One observer per registry: a second one on the same registry would register the same names.
    """

    def __init__(self, registry: CollectorRegistry | None = None,
                 namespace: str = "debatebus") -> None:
        self.registry = REGISTRY if registry is None else registry
        self._namespace = namespace
        self._lifecycle_metrics()
        self._llm_metrics()

    def _counter(self, name: str, doc: str, labels: tuple[str, ...] = _BY_TYPE) -> Counter:
        return Counter(name, doc, labels, namespace=self._namespace, registry=self.registry)

    def _lifecycle_metrics(self) -> None:
        self.debates_started = self._counter(
            "debates_started", "Debates the engine started, fresh or resumed.")
        self.debates_completed = self._counter(
            "debates_completed", "Debates that ran to a completed result.")
        self.debates_failed = self._counter(
            "debates_failed", "Debates that ran and ended failed (models down, budget, deadline).")
        self.debates_replayed = self._counter(
            "debates_replayed", "Requests answered with a stored result, without running again.")
        self.debates_resumed = self._counter(
            "debates_resumed", "Debates resumed from a checkpoint after an interrupted run.")
        self.rounds = self._counter("rounds", "Debate rounds completed.")
        self.redeliveries = self._counter(
            "redeliveries", "Deliveries of a request that had been delivered before.")
        self.dlq_entries = self._counter(
            "dlq_entries", "Messages moved to the dead-letter topic ({type}:dlq).")
        self.bad_inputs = self._counter(
            "bad_inputs", "Requests answered with a failure because their input was invalid.")
        self.unsettled = self._counter(
            "unsettled", "Deliveries left unsettled for redelivery (handler or broker error).")
        self.in_flight = Gauge(
            "debates_in_flight", "Requests this worker is handling now.", _BY_TYPE,
            namespace=self._namespace, registry=self.registry)
        self.debate_duration = Histogram(
            "debate_duration_seconds", "Time from taking a request to settling it, for debates "
            "that ran (outcome completed or failed).", (*_BY_TYPE, "outcome"),
            namespace=self._namespace, registry=self.registry, buckets=DEBATE_BUCKETS)
        # Summaries (count and sum, so a mean): histograms here are durations, in seconds.
        self.debate_phi_hat = Summary(
            "debate_phi_hat", "Φ̂ of debates that ran: how much the participants' wording moved "
            "(0..1; the result's debatePhiHat).", _BY_TYPE,
            namespace=self._namespace, registry=self.registry)
        self.debate_agents = Summary(
            "debate_agents", "Participants with at least one turn that did not fail, per debate "
            "that ran (the result's debateAgents).", _BY_TYPE,
            namespace=self._namespace, registry=self.registry)
        self._by_outcome: dict[str, Counter] = {
            "completed": self.debates_completed, "failed": self.debates_failed,
            "replayed": self.debates_replayed, "bad_input": self.bad_inputs,
            "dead_lettered": self.dlq_entries, "unsettled": self.unsettled,
        }

    def _llm_metrics(self) -> None:
        self.llm_calls = self._counter(
            "llm_calls", "LLM calls made by debates; outcome ok or error.",
            ("participant", "model", "purpose", "outcome"))
        self.llm_tokens = self._counter(
            "llm_tokens", "Tokens spent on LLM calls; kind prompt or completion, and of the "
            "prompt tokens, cache_read (read from the provider's prompt cache) and cache_write "
            "(written to it).", ("participant", "model", "kind"))
        self.debate_cost = self._counter(
            "debate_cost", "Money spent by debates that ran, in the currency of their prices: "
            "their results' debateCost total (sub-debates included; only debates whose every "
            "model was priced).", (*_BY_TYPE, "currency"))
        self.llm_call_duration = Histogram(
            "llm_call_duration_seconds", "Duration of one LLM call.", ("model", "purpose"),
            namespace=self._namespace, registry=self.registry, buckets=CALL_BUCKETS)
        self.ratelimit_wait = Histogram(
            "ratelimit_wait_seconds", "Time an LLM call waited for rate-limit budget, by limit "
            "name (the model); zero waits included.", ("limit",),
            namespace=self._namespace, registry=self.registry, buckets=WAIT_BUCKETS)

    def ratelimit_waited(self, limit: str, seconds: float) -> None:
        """A rate limiter's ``on_wait``: ``with_rate_limits(llm, on_wait=observer.ratelimit_waited)``."""
        self.ratelimit_wait.labels(limit).observe(seconds)

    # ---- hooks --------------------------------------------------------------------------------

    def request_started(self, ctx: RequestContext) -> None:
        self.in_flight.labels(ctx.event_type).inc()
        if ctx.deliveries > 1:
            self.redeliveries.labels(ctx.event_type).inc()

    def debate_event(self, ctx: RequestContext, event: ev.DebateEvent) -> None:
        if isinstance(event, ev.DebateStarted):
            self.debates_started.labels(ctx.event_type).inc()
            if event.resumed_from_round > 0:
                self.debates_resumed.labels(ctx.event_type).inc()
        elif isinstance(event, ev.RoundCompleted):
            self.rounds.labels(ctx.event_type).inc()
        elif isinstance(event, CallEvent):
            self._count_call(event)

    def _count_call(self, event: CallEvent) -> None:
        model, purpose = model_of(event), CALL_PURPOSES[type(event)]
        outcome = "error" if isinstance(event, ev.TurnFailed) else "ok"
        self.llm_calls.labels(event.speaker, model, purpose, outcome).inc()
        self.llm_tokens.labels(event.speaker, model, "prompt").inc(event.usage.prompt_tokens)
        self.llm_tokens.labels(event.speaker, model, "completion").inc(
            event.usage.completion_tokens)
        self.llm_tokens.labels(event.speaker, model, "cache_read").inc(
            event.usage.cache_read_tokens)
        self.llm_tokens.labels(event.speaker, model, "cache_write").inc(
            event.usage.cache_write_tokens)
        self.llm_call_duration.labels(model, purpose).observe(event.duration_ms / 1000.0)

    def request_finished(self, ctx: RequestContext, outcome: Settlement,
                         result: HandlerResult | None, duration_s: float) -> None:
        self.in_flight.labels(ctx.event_type).dec()
        counter = self._by_outcome.get(outcome)
        if counter is not None:
            counter.labels(ctx.event_type).inc()
        if outcome in ("completed", "failed"):
            self.debate_duration.labels(ctx.event_type, outcome).observe(duration_s)
            if result is not None:
                self._observe_result(ctx.event_type, result.fields)

    def _observe_result(self, event_type: str, fields: dict[str, Any]) -> None:
        """Φ̂, agents and cost from the published result, so both tell the same figures."""
        phi_hat, agents = fields.get("debatePhiHat"), fields.get("debateAgents")
        if isinstance(phi_hat, int | float):
            self.debate_phi_hat.labels(event_type).observe(phi_hat)
        if isinstance(agents, list):
            self.debate_agents.labels(event_type).observe(len(agents))
        cost = fields.get("debateCost")
        if isinstance(cost, dict) and isinstance(cost.get("total"), int | float):
            self.debate_cost.labels(event_type, str(cost.get("currency", ""))).inc(cost["total"])


#: The only path served; anything else is a 404.
METRICS_PATH = "/metrics"
DEFAULT_METRICS_HOST = "127.0.0.1"
#: Where ``debatebus worker`` reads the metrics token when ``--metrics-token`` is not given.
METRICS_TOKEN_ENV = "DEBATEBUS_METRICS_TOKEN"

_StartResponse = Callable[[str, list[tuple[str, str]]], Any]
_WSGIApp = Callable[[dict[str, Any], _StartResponse], Iterable[bytes]]


def _only_metrics(app: _WSGIApp, access: Access) -> _WSGIApp:
    """``app`` at ``METRICS_PATH`` only, for requests sent to an allowed Host with the token."""

    def serve(environ: dict[str, Any], start_response: _StartResponse) -> Iterable[bytes]:
        query_tokens = parse_qs(environ.get("QUERY_STRING", "")).get(TOKEN_QUERY)
        refusal = access.refusal(environ.get("HTTP_HOST"), environ.get("HTTP_AUTHORIZATION"),
                                 query_tokens[-1] if query_tokens else None)
        if refusal is not None:
            start_response(f"{refusal.status.value} {refusal.status.phrase}", [
                ("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store"),
                *refusal.headers])
            return [refusal.message.encode()]
        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"not found: metrics are at {METRICS_PATH}\n".encode()]
        return app(environ, start_response)

    return serve


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood stderr."""


class MetricsServer(ThreadingMixIn, WSGIServer):
    """The HTTP server behind ``start_metrics_server``; ``shutdown()`` then ``server_close()``
    stop it. IPv4 or IPv6, whichever ``host`` resolves to."""

    daemon_threads = True

    def __init__(self, host: str, port: int, app: _WSGIApp) -> None:
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        super().__init__((host, port), _QuietHandler)
        self.set_app(app)


def start_metrics_server(port: int, registry: CollectorRegistry | None = None,
                         host: str = DEFAULT_METRICS_HOST, *, token: str | None = None,
                         allowed_hosts: Iterable[str] = (),
                         ) -> tuple[MetricsServer, threading.Thread]:
    """Serve ``/metrics`` (and nothing else) on ``host:port`` from a daemon thread.

    ``host`` defaults to loopback: metrics name models and event types, so exposing them is a
    choice (``host="0.0.0.0"``, or ``--metrics-host`` on ``debatebus worker``), which logs a
    WARNING unless a ``token`` is set. With ``token``, a scrape needs ``Authorization: Bearer
    <token>`` (Prometheus: ``authorization: {credentials: …}``) or ``?token=``; else 401.
    On loopback (against DNS rebinding: a browser led to read it as another site), scrapes are
    answered only when sent to loopback or one of ``allowed_hosts``; else 421. Bound beyond
    loopback, where scrapers reach it by whatever name or address they know (a pod's IP), any
    ``Host`` is answered unless ``allowed_hosts`` names some (``*.example.com``; ``*``): the
    token is what guards it there."""
    hosts = ([*allowed_hosts, host] if allowed_hosts or is_loopback(host) else ["*"])
    access = Access.of(token, hosts,
                       host_option="debatebus worker --metrics-allowed-host; "
                                   "start_metrics_server(allowed_hosts=…)")
    server = MetricsServer(host, port, _only_metrics(
        make_wsgi_app(REGISTRY if registry is None else registry), access))
    warn_if_exposed(log, host, server.server_address[1], token, serves="the metrics server",
                    exposes="this worker's metrics (event types, model and participant names, "
                            "token counts, debate outcomes)",
                    set_token=f"--metrics-token or ${METRICS_TOKEN_ENV}, "
                              "start_metrics_server(token=…)")
    thread = threading.Thread(target=server.serve_forever, name="debatebus-metrics", daemon=True)
    thread.start()
    return server, thread
