"""``debatebus worker | publish | tail | demo``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

from debatebus._collector import DEFAULT_COLLECTOR
from debatebus._demo import DEMO_EVENT_TYPE, DEMO_GROUP, build_debate, serve
from debatebus._worker import DebateBus
from debatebus.cli._common import add_broker, load_attribute, port, positive_int, seconds
from debatebus.cli._run_cmd import DebateView, screen_for
from debatebus.client import BusClient
from debatebus.exceptions import ConfigError
from debatebus.llm._registry import resolve_llm
from debatebus.observability._logs import LoggingObserver, configure_logging
from debatebus.observability._observer import Observer, RequestContext
from debatebus.schemas.events import DebateEvent
from debatebus.transports import broker_url


def add_parser(sub: Any) -> None:
    worker = sub.add_parser("worker", help="serve a DebateBus app: debatebus worker myapp:app")
    worker.add_argument("app", help="module:attribute of a DebateBus (or a function returning one)")
    worker.add_argument("--concurrency", type=positive_int, metavar="N",
                        help="debates at once in this process (default: the app's concurrency, "
                             "16 unless it sets another)")
    worker.add_argument("--consumer", type=_consumer, metavar="NAME",
                        help="this worker's name in its group, for `debatebus check --consumer "
                             "NAME` (default: the app's, else $DEBATEBUS_CONSUMER, else "
                             "host-pid-random); one per live worker")
    _add_observability(worker)
    worker.set_defaults(func=_worker)

    publish = sub.add_parser("publish", help="publish a debate request")
    publish.add_argument("type", help="event type, e.g. debate:request")
    publish.add_argument("--input", help="the debate question (payload.input)")
    publish.add_argument("--payload", help="the whole payload as JSON (overrides --input)")
    publish.add_argument("--request-id", help="the request's requestId (default: a new UUID)")
    publish.add_argument("--correlation-id", metavar="ID",
                         help="the request's correlationId (default: none; the result's is then "
                              "the requestId)")
    publish.add_argument("--header", type=_header, action="append", metavar="K=V",
                         help="an envelope header, e.g. traceparent=00-…-01 (repeatable)")
    publish.add_argument("--wait", action="store_true", help="wait for the result and print it")
    publish.add_argument("--timeout", type=seconds, default=300.0, metavar="S",
                         help="with --wait: give up after this many seconds (default 300)")
    add_broker(publish)
    publish.set_defaults(func=_publish)

    tail = sub.add_parser("tail", help="print messages on an event type as JSON lines")
    tail.add_argument("type", help="event type, e.g. event:debate:request:completed")
    tail.add_argument("--count", type=positive_int, metavar="N",
                      help="stop after this many messages")
    add_broker(tail)
    tail.set_defaults(func=_tail)

    demo = sub.add_parser("demo", help="serve the demo debate on a bus and answer one request")
    demo.add_argument("question", nargs="?", default="Should we adopt microservices?",
                      help="what to debate")
    demo.add_argument("--llm", help="model spec (local, openai:MODEL, scripted:FILE.json, …; "
                                    "default: $DEBATEBUS_LLM, else local)")
    demo.add_argument("--broker", help="broker URL (default: $DEBATEBUS_BROKER, else memory://); "
                      "the demo asks and answers on its own event type and group, never on "
                      "debate:request")
    demo.set_defaults(func=_demo)


def _add_observability(worker: argparse.ArgumentParser) -> None:
    worker.add_argument("--metrics-port", type=port, metavar="PORT",
                        help="serve Prometheus metrics on http://HOST:PORT/metrics")
    worker.add_argument("--metrics-host", metavar="HOST",
                        help="interface for --metrics-port (default loopback, 127.0.0.1; "
                             "0.0.0.0 exposes the metrics on every interface: set a token)")
    worker.add_argument("--metrics-token", metavar="TOKEN",
                        help="require this bearer token on scrapes (default "
                             "$DEBATEBUS_METRICS_TOKEN, which ps does not show); Prometheus "
                             "sends it with authorization: {credentials: …}")
    worker.add_argument("--metrics-allowed-host", action="append", metavar="HOST",
                        help="also answer scrapes sent to HOST, a name or address Prometheus "
                             "scrapes by (repeatable; *.example.com; * for any). Loopback and "
                             "--metrics-host are always answered; others get 421")
    worker.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="text lines, or one JSON object per line (default text)")
    worker.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="default INFO")
    worker.add_argument("--log-transcripts", action="store_true",
                        help="also log topics, turns and outputs (left out by default)")
    worker.add_argument("--otel", action="store_true",
                        help="OpenTelemetry spans per debate, round and LLM call, sent to the "
                             "global tracer provider (e.g. run under opentelemetry-instrument)")


def _observe(app: DebateBus, args: argparse.Namespace) -> None:
    app.add_observer(LoggingObserver(log_transcripts=args.log_transcripts))
    for option, given in (("--metrics-host", args.metrics_host),
                          ("--metrics-token", args.metrics_token),
                          ("--metrics-allowed-host", args.metrics_allowed_host)):
        if given and not args.metrics_port:
            raise ConfigError(f"{option} needs --metrics-port: give both, or neither")
    if args.metrics_port:
        try:  # imported here: prometheus-client is an optional extra (debatebus[metrics])
            from debatebus.observability._metrics import (
                DEFAULT_METRICS_HOST,
                METRICS_TOKEN_ENV,
                PrometheusObserver,
                start_metrics_server,
            )
        except ImportError as exc:
            raise ConfigError(str(exc)) from exc
        host = args.metrics_host or DEFAULT_METRICS_HOST
        token = args.metrics_token or os.environ.get(METRICS_TOKEN_ENV) or None
        try:
            start_metrics_server(args.metrics_port, host=host, token=token,
                                 allowed_hosts=args.metrics_allowed_host or ())
        except OSError as exc:  # port taken, unknown host…
            raise ConfigError(f"cannot serve metrics on {host}:{args.metrics_port}: "
                              f"{exc.strerror or exc}") from None
        app.add_observer(PrometheusObserver())
    if args.otel:  # imported here: OpenTelemetry is an optional extra (debatebus[otel])
        from debatebus.observability._tracing import TracingObserver, provider_configured

        tracing = TracingObserver()
        if not tracing.enabled:
            raise ConfigError("--otel needs OpenTelemetry: pip install 'debatebus[otel]'")
        if not provider_configured():
            logging.getLogger("debatebus.worker").warning(
                "--otel: no OpenTelemetry SDK is set up in this process, so spans are dropped; "
                "run the worker under opentelemetry-instrument or set a tracer provider in %s",
                args.app)
        app.add_observer(tracing)


def load_app(spec: str) -> DebateBus:
    target = load_attribute(spec, "app")
    app = target() if callable(target) and not isinstance(target, DebateBus) else target
    if not isinstance(app, DebateBus):
        raise ConfigError(f"{spec!r} is a {type(app).__name__}, not a DebateBus")
    return app


async def _worker(args: argparse.Namespace) -> int:
    configure_logging(args.log_format, args.log_level)
    app = load_app(args.app)
    _observe(app, args)
    if args.concurrency:
        app.concurrency = args.concurrency
    if args.consumer:
        app.consumer = args.consumer
    if app.collector is None:  # the command owns its process: tune the collector for serving
        app.collector = DEFAULT_COLLECTOR
    async with app:
        await app.run()
    return 0


def _payload(args: argparse.Namespace) -> dict[str, Any]:
    if args.payload:
        try:
            value = json.loads(args.payload)
        except json.JSONDecodeError as exc:
            where = args.payload[exc.pos:exc.pos + 20]
            raise ConfigError(f"--payload must be a JSON object: {exc.msg} (line {exc.lineno},"
                              f" column {exc.colno}: {where!r}); e.g. --payload "
                              """'{"input": "Adopt Kafka?"}'""") from None
        if not isinstance(value, dict):
            raise ConfigError("--payload must be a JSON object")
        return value
    if args.input is None:
        raise ConfigError("give --input 'topic' or --payload '{\"input\": …}'")
    return {"input": args.input}


def _consumer(value: str) -> str:
    """An argparse type: a consumer name, not blank."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must name the consumer, e.g. worker-1")
    return value


def _header(value: str) -> tuple[str, str]:
    name, eq, text = value.partition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"expected K=V, got {value!r}")
    return name, text


async def _publish(args: argparse.Namespace) -> int:
    options: dict[str, Any] = {"request_id": args.request_id, "correlation_id": args.correlation_id,
                               "headers": dict(args.header or [])}
    async with BusClient(broker_url(args.broker)) as client:
        if not args.wait:
            print(await client.publish(args.type, _payload(args), **options))
            return 0
        result = await client.request(args.type, _payload(args), timeout=args.timeout, **options)
        print(json.dumps({
            "requestId": result.request_id, "messageId": result.message_id,
            "correlationId": result.correlation_id, "causationId": result.causation_id,
            "timestamp": result.timestamp, "type": result.type, "headers": result.headers,
            "payload": result.payload}, indent=2, ensure_ascii=False))
        return 0 if result.payload.get("debateStatus") != "failed" else 1


async def _tail(args: argparse.Namespace) -> int:
    async with BusClient(broker_url(args.broker)) as client:
        seen = 0
        async for delivery in await client.transport.subscribe([args.type]):
            print(delivery.body.decode("utf-8", "replace"), flush=True)
            seen += 1
            if args.count and seen >= args.count:
                break
    return 0


class _ShowTurns(Observer):
    """Feeds one request's debate events to the ``debatebus run`` view as they happen."""

    def __init__(self, request_id: str, on_event: Callable[[DebateEvent], None]) -> None:
        self._request_id = request_id
        self._on_event = on_event

    def debate_event(self, ctx: RequestContext, event: DebateEvent) -> None:
        if ctx.request_id == self._request_id:  # a shared broker may bring others' requests
            self._on_event(event)


async def _demo(args: argparse.Namespace) -> int:
    debate = build_debate(resolve_llm(args.llm))
    url = args.broker or os.environ.get("DEBATEBUS_BROKER") or "memory://"
    app = serve(debate, url, event_type=DEMO_EVENT_TYPE, group=DEMO_GROUP)
    view = DebateView(debate, screen_for(sys.stdout))
    request_id = uuid.uuid4().hex
    app.add_observer(_ShowTurns(request_id, view.on_event))
    try:
        async with app:
            worker = asyncio.create_task(app.run())
            async with BusClient(url) as client:
                result = await client.request(DEMO_EVENT_TYPE, {"input": args.question},
                                              request_id=request_id)
            app.stop()
            await worker
        view.screen.heading("Result")
    finally:
        view.screen.close()
    payload = result.payload
    print(json.dumps({k: payload.get(k) for k in (
        "debateStatus", "debateRounds", "debateOutput", "debateVerdict", "debatePhiHat",
        "debateTokenUsage", "debateError")}, indent=2, ensure_ascii=False))
    return 0 if payload.get("debateStatus") == "completed" else 1
