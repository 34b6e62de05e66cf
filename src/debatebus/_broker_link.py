"""The worker's view of its broker: up, or in an outage, with the backoff between reconnects;
and how log lines name the broker."""

from __future__ import annotations

import asyncio
import logging

from debatebus._backoff import BROKER_BASE_S, BROKER_CAP_S, Backoff
from debatebus.exceptions import TransportError
from debatebus.transports import Transport

#: The worker's logger: outages are the worker's news.
log = logging.getLogger("debatebus.worker")


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
