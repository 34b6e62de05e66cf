"""Transports: one interface (``Transport``) and small implementations, chosen by broker URL.

The Redis and Kafka transports are imported only when their URL is given: redis-py and aiokafka
are optional extras (``debatebus[redis]``, ``debatebus[kafka]``)."""

from __future__ import annotations

import os
from typing import Any, Final
from urllib.parse import urlsplit

from debatebus._redaction import redact
from debatebus.exceptions import ConfigError
from debatebus.transports._base import Delivery, Outgoing, Transport, dlq_topic
from debatebus.transports._dialect import WireDialect
from debatebus.transports._memory import MemoryBroker, MemoryTransport
from debatebus.transports._synkro import SynkroDialect, step_channel

__all__ = [
    "DEFAULT_BROKER",
    "Delivery",
    "MemoryBroker",
    "MemoryTransport",
    "Outgoing",
    "SynkroDialect",
    "Transport",
    "WireDialect",
    "broker_url",
    "dlq_topic",
    "redis_server_url",
    "step_channel",
    "transport_from_url",
]

#: The broker when none is given and ``$DEBATEBUS_BROKER`` is unset.
DEFAULT_BROKER: Final = "redis://localhost:6379/0"

SCHEMES = ("memory://", "redis://", "rediss://", "redis+pubsub://", "rediss+pubsub://", "kafka://")
#: Redis Streams' schemes, and Redis pub/sub's: the same server behind a ``+pubsub``.
_REDIS_SCHEMES: Final = ("redis", "rediss")
_PUBSUB: Final = "+pubsub"


def redis_server_url(url: str) -> str | None:
    """The ``redis://`` (``rediss://``) URL of the Redis server a broker URL names, or None when
    it names no Redis: a pub/sub URL (``redis+pubsub://…``) names the same server, db and options
    as the Streams URL without its ``+pubsub``."""
    scheme = urlsplit(url).scheme
    if scheme in _REDIS_SCHEMES:
        return url
    if scheme.removesuffix(_PUBSUB) in _REDIS_SCHEMES and scheme.endswith(_PUBSUB):
        return scheme.removesuffix(_PUBSUB) + url[len(scheme):]
    return None


def _bad_url(url: str, why: object) -> ConfigError:
    return ConfigError(f"bad broker URL {redact(url)!r}: {why}; e.g. redis://localhost:6379/0 or "
                       "kafka://localhost:9092")


def _scheme(url: str) -> str:
    """The URL's scheme, once its host and port parse: ConfigError (never the password) if not."""
    try:
        parts = urlsplit(url)
        # one port per host: kafka://host:port,host:port, or a Redis Cluster's seeds
        for host in parts.netloc.rpartition("@")[2].split(","):
            _ = urlsplit(f"//{host}").port  # reading it validates it
    except ValueError as exc:  # a port that is not a number from 0 to 65535, a broken [IPv6]
        raise _bad_url(url, exc) from None
    return parts.scheme


def broker_url(value: str | None = None) -> str:
    """The broker to use: ``value``, else ``$DEBATEBUS_BROKER``, else ``DEFAULT_BROKER`` (the one
    rule of ``DebateBus()``, ``BusClient()`` and every CLI command)."""
    return value or os.environ.get("DEBATEBUS_BROKER") or DEFAULT_BROKER


def transport_from_url(url: str, **options: Any) -> Transport:
    """``redis://`` and ``rediss://`` → Redis Streams; ``redis+pubsub://`` → Synkro-compatible
    pub/sub; ``kafka://host:port[,host:port][?partitions=N]`` → Kafka; ``memory://`` →
    in-process. On Redis and Kafka, ``?topic_retention=7d`` sets ``topic_retention_s``;
    ``options`` (the transport's keyword arguments) win over the URL's."""
    scheme = _scheme(url)
    if scheme == "memory":
        return MemoryTransport(options.pop("broker", None))
    server = redis_server_url(url)
    if server is not None and scheme in _REDIS_SCHEMES:
        from debatebus.transports._redis_streams import RedisStreamsTransport

        return RedisStreamsTransport(server, **options)
    if server is not None:
        from debatebus.transports._redis_pubsub import RedisPubSubTransport

        return RedisPubSubTransport(server, **options)
    if scheme == "kafka":
        from debatebus.transports.kafka import KafkaTransport
        from debatebus.transports.kafka._settings import url_options

        servers, from_url = url_options(url)
        return KafkaTransport(servers, **{**from_url, **options})
    raise ConfigError(
        f"unsupported broker URL {redact(url)!r}: use one of {', '.join(SCHEMES)}")
