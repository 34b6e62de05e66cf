"""``debatebus asyncapi`` (the bus's AsyncAPI document) and ``debatebus web`` (the live page)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from debatebus._durations import duration_s
from debatebus._redaction import redact
from debatebus.asyncapi import build_asyncapi
from debatebus.cli._bus_cmds import load_app
from debatebus.cli._common import add_broker, port, positive_int
from debatebus.exceptions import ConfigError
from debatebus.transports import broker_url

_WEB_MODULES = ("starlette", "uvicorn")


def add_parser(sub: Any) -> None:
    asyncapi = sub.add_parser("asyncapi", help="print the AsyncAPI 3.0 document of the bus")
    asyncapi.add_argument("app", nargs="?",
                          help="module:attribute of a DebateBus (or a function returning one) to "
                               "document its routes; without it, a worker serving --event-type")
    asyncapi.add_argument("--format", choices=("yaml", "json"), default="yaml",
                          help="output format (YAML needs PyYAML, else JSON is written)")
    asyncapi.add_argument("--event-type",
                          help="without an app: the request event type the workers serve "
                               "(default debate:request)")
    asyncapi.add_argument("--output", "-o", help="write to this file instead of standard output")
    asyncapi.add_argument("--broker",
                          help="broker URL whose hosts the document's servers name (never its "
                               "password or query); default $DEBATEBUS_BROKER, else an example "
                               "server on localhost for each transport")
    asyncapi.set_defaults(func=_asyncapi)

    web = sub.add_parser("web", help="serve the live debate page (needs the web extra)")
    add_broker(web)
    web.add_argument("--host", default="127.0.0.1",
                     help="interface to listen on (default 127.0.0.1: transcripts are not public; "
                          "beyond loopback, set a token)")
    web.add_argument("--port", type=port, default=8000, help="port to listen on")
    web.add_argument("--token", help="require this bearer token on every request (default "
                                     "$DEBATEBUS_WEB_TOKEN, which ps does not show); browsers "
                                     "open http://HOST:PORT/?token=…")
    web.add_argument("--allowed-host", action="append", metavar="HOST",
                     help="also answer requests sent to HOST, a name or address the page is "
                          "reached by (repeatable; *.example.com; * for any). Loopback and "
                          "--host are always answered; others get 421 (DNS rebinding)")
    web.add_argument("--history", type=positive_int, default=200, metavar="N",
                     help="debates kept in memory (default 200)")
    web.add_argument("--events-topic", default="debate:events",
                     help="where workers publish debate events (DebateBus(events_topic=…))")
    web.add_argument("--catch-up", type=_catch_up, default="24h", metavar="DURATION",
                     help="at start, read the events topic's history this far back (30m, 24h, "
                          "7d; 0: none; all: the whole topic), so the page still shows the "
                          "debates before a restart (default 24h)")
    web.set_defaults(func=_web)


def _catch_up(value: str) -> float | None:
    """An argparse type: a duration in seconds, 0 for none, or None ("all") for everything."""
    if value.strip().lower() == "all":
        return None
    if value.strip() == "0":
        return 0.0
    seconds = duration_s(value)
    if seconds is None:
        raise argparse.ArgumentTypeError(f"must be a duration (30m, 24h, 7d), 0 or all, not "
                                         f"{value!r}")
    return seconds


def render_asyncapi(document: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    try:
        yaml = importlib.import_module("yaml")
    except ModuleNotFoundError:
        # JSON is YAML (1.2), so the document stays usable; only less pleasant to read.
        print("debatebus: PyYAML is not installed, writing JSON (valid YAML)", file=sys.stderr)
        return render_asyncapi(document, "json")
    return str(yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100))


async def _asyncapi(args: argparse.Namespace) -> int:
    if args.app and args.event_type:
        raise ConfigError("give an app or --event-type, not both: the app names its event types")
    source = load_app(args.app) if args.app else args.event_type or "debate:request"
    broker = args.broker or os.environ.get("DEBATEBUS_BROKER")
    text = render_asyncapi(build_asyncapi(source, broker=broker), args.format)
    if args.output:
        await asyncio.to_thread(Path(args.output).write_text, text, "utf-8")
    else:
        sys.stdout.write(text)
    return 0


async def _web(args: argparse.Namespace) -> int:
    try:
        from debatebus.web._server import TOKEN_ENV, build_server
    except ModuleNotFoundError as exc:
        if exc.name not in _WEB_MODULES:
            raise
        raise ConfigError("debatebus web needs the web extra: pip install -e '.[web]' in a "
                          "checkout (see the README's Installing extras)") from exc
    url = broker_url(args.broker)
    server = build_server(url, host=args.host, port=args.port,
                          token=args.token or os.environ.get(TOKEN_ENV) or None,
                          allowed_hosts=args.allowed_host or (), history=args.history,
                          events_topic=args.events_topic, catch_up_s=args.catch_up)
    print(f"debatebus web: following {args.events_topic} on {redact(url)}; a debate shows up only "
          "when its worker publishes events: DebateBus(..., publish_events=True)",
          file=sys.stderr, flush=True)
    await server.serve()
    return 0
