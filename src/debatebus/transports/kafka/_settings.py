"""``KafkaSettings``: what a ``KafkaTransport`` was configured with, as one frozen value that its
consumer-group members and readers read too. Imports nothing from aiokafka."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl

from debatebus._retention import TOPIC_RETENTION_PARAM, parse_retention, retention_ms
from debatebus.exceptions import ConfigError
from debatebus.transports.kafka._partitioner import partition

POLL_MS: Final = 200  # how long one getmany waits when idle; bounds a fetch loop's reaction time


#: What a ``kafka://`` URL's query may set: every client of a bus shares its URL, and so these.
URL_OPTIONS: Final = ("partitions", "replication_factor", TOPIC_RETENTION_PARAM)


def url_options(url: str) -> tuple[str, dict[str, Any]]:
    """The servers and topic options of
    ``kafka://h1:p1[,h2:p2][?partitions=N&replication_factor=M&topic_retention=7d]`` as
    ``KafkaTransport`` keyword arguments (the topics a transport creates get these; existing
    topics keep theirs)."""
    rest = url.split("://", 1)[1]
    hosts, _, query = rest.partition("?")
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in URL_OPTIONS:
            raise ConfigError(f"unknown kafka:// URL parameter {name!r}: use "
                              f"{', '.join(URL_OPTIONS)}")
        if name == TOPIC_RETENTION_PARAM:
            options["topic_retention_s"] = parse_retention(value, param=name)
            continue
        try:
            options[name] = int(value)
        except ValueError:
            raise ConfigError(f"kafka:// URL parameter {name} must be a whole number, "
                              f"not {value!r}") from None
    return parse_servers(hosts.split("/", 1)[0]), options


def parse_servers(bootstrap_servers: str | Sequence[str]) -> str:
    """``"h1:p1,h2:p2"`` from ``"host:port"``, ``"h1:p1,h2:p2"`` or a list of either."""
    hosts = [bootstrap_servers] if isinstance(bootstrap_servers, str) else bootstrap_servers
    servers = [h.strip() for entry in hosts for h in entry.split(",") if h.strip()]
    if not servers:
        raise ConfigError("KafkaTransport needs bootstrap servers, e.g. 'localhost:9092'")
    return ",".join(servers)


@dataclass(frozen=True, slots=True, kw_only=True)
class KafkaSettings:
    """A ``KafkaTransport``'s configuration; its constructor's keyword arguments say what each
    means, and hold the defaults."""

    servers: str  # comma-separated host:port pairs: see ``parse_servers``
    partitions: int
    replication_factor: int
    topic_retention_s: float
    connect_timeout: float
    request_timeout: float
    session_timeout_ms: int
    heartbeat_interval_ms: int
    max_poll_interval_ms: int
    revoke_grace_ms: int
    fetch_max_wait_ms: int
    linger_ms: int
    max_request_size: int
    client_id: str

    def __post_init__(self) -> None:
        if self.partitions < 1 or self.replication_factor < 1:
            raise ConfigError("partitions and replication_factor must be at least 1")
        retention_ms(self.topic_retention_s, name="topic_retention_s")
        if self.linger_ms < 0:
            raise ConfigError(f"linger_ms must be at least 0, not {self.linger_ms}")

    @property
    def revoke_grace(self) -> float:
        """``revoke_grace_ms`` in seconds."""
        return self.revoke_grace_ms / 1000

    @property
    def topic_configs(self) -> dict[str, str]:
        """The configs of the topics this transport creates: ``retention.ms`` (-1: kept forever)."""
        keep_ms = retention_ms(self.topic_retention_s, name="topic_retention_s")
        return {"retention.ms": str(-1 if keep_ms is None else keep_ms)}

    @property
    def fetch_options(self) -> dict[str, Any]:
        """aiokafka consumer options of every consumer, group member or reader."""
        # Tansu answers a parked fetch only when fetch_max_wait_ms runs out, not when data
        # arrives (Kafka answers at once), so this bounds delivery latency there. 100 ms costs an
        # idle consumer ten cheap fetches a second on Kafka; lower it for latency on Tansu.
        return {"fetch_max_wait_ms": self.fetch_max_wait_ms}

    @property
    def producer_options(self) -> dict[str, Any]:
        """aiokafka producer options."""
        return {
            "acks": "all",
            "enable_idempotence": False,  # Tansu lacks it; for duplicates see ``transport``
            "max_request_size": self.max_request_size,
            # A full batch makes send() wait for it to drain, and aiokafka's default 16 KiB holds
            # a few debate results: let a batch be as large as one record may be.
            "max_batch_size": self.max_request_size,
            "linger_ms": self.linger_ms,
            "partitioner": partition,  # the Java client's partitions, at half aiokafka's cost
            "request_timeout_ms": int(self.request_timeout * 1000),
        }

    @property
    def group_options(self) -> dict[str, Any]:
        """aiokafka consumer options of a group member."""
        return {
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "max_poll_interval_ms": self.max_poll_interval_ms,
            # aiokafka defaults this to the session timeout; the revoke hook may take the grace.
            "rebalance_timeout_ms": self.session_timeout_ms + self.revoke_grace_ms,
        }
