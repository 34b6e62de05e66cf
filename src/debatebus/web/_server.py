"""The live page on uvicorn (``debatebus web``): the app with its token and hosts, a WARNING when
it binds beyond loopback without a token, and access logs that never show the token."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from debatebus._access import warn_if_exposed
from debatebus._redaction import redact
from debatebus._worker import EVENTS_TOPIC
from debatebus.transports import Transport
from debatebus.web._app import DEFAULT_CATCH_UP_S, create_app

log = logging.getLogger("debatebus.web")

DEFAULT_HOST = "127.0.0.1"
#: Where ``debatebus web`` reads its token when ``--token`` is not given.
TOKEN_ENV = "DEBATEBUS_WEB_TOKEN"


class _MaskToken(logging.Filter):
    """Masks the token in uvicorn's lines: an access line holds the path with its query."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self.secrets = (token, quote(token, safe=""))

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(arg, self.secrets) if isinstance(arg, str) else arg
                                for arg in record.args)
        if isinstance(record.msg, str):
            record.msg = redact(record.msg, self.secrets)
        return True


def _log_config(token: str | None) -> dict[str, Any]:
    """uvicorn's own logging setup, with the token masked on every handler when there is one."""
    config = copy.deepcopy(LOGGING_CONFIG)
    if token is not None:
        config.setdefault("filters", {})["mask_token"] = {"()": _MaskToken, "token": token}
        for handler in config["handlers"].values():
            handler.setdefault("filters", []).append("mask_token")
    return config


def build_server(broker_url_or_transport: str | Transport, *, host: str = DEFAULT_HOST,
                 port: int = 8000, token: str | None = None, allowed_hosts: Iterable[str] = (),
                 history: int = 200, events_topic: str = EVENTS_TOPIC,
                 log_level: str = "info",
                 catch_up_s: float | None = DEFAULT_CATCH_UP_S) -> uvicorn.Server:
    """A uvicorn server for the live page on ``host:port``; ``await server.serve()`` runs it.

    Requests sent to loopback, to ``host`` or to ``allowed_hosts`` are answered, with ``token``
    when one is set (``create_app``). Without a token on an address beyond loopback it logs a
    WARNING: every debate's transcript is then readable by anyone who can reach the port."""
    hosts = [*allowed_hosts, host] if host else list(allowed_hosts)
    app = create_app(broker_url_or_transport, history=history, events_topic=events_topic,
                     token=token, allowed_hosts=hosts, catch_up_s=catch_up_s)
    warn_if_exposed(
        log, host, port, token, serves="debatebus web (the live page)",
        exposes="every debate's question, turns, verdicts and result as they happen",
        set_token=f"--token or ${TOKEN_ENV}, build_server(token=…); browsers then open "
                  f"http://HOST:{port}/?token=…")
    # Open event streams would hold a graceful shutdown forever; cut them after a few seconds.
    return uvicorn.Server(uvicorn.Config(
        app, host=host, port=port, timeout_graceful_shutdown=3, log_level=log_level,
        log_config=_log_config(token)))
