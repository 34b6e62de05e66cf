"""Transports: one interface (``Transport``) and small implementations, chosen by broker URL."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from debatebus.exceptions import ConfigError
from debatebus.transports.base import Delivery, Outgoing, Transport, dlq_topic
from debatebus.transports.memory import MemoryBroker, MemoryTransport

__all__ = [
    "Delivery",
    "MemoryBroker",
    "MemoryTransport",
    "Outgoing",
    "Transport",
    "dlq_topic",
    "transport_from_url",
]

SCHEMES = ("memory://", "redis://", "rediss://", "redis+pubsub://", "rediss+pubsub://", "kafka://")


def transport_from_url(url: str, **options: Any) -> Transport:
    """``redis://`` and ``rediss://`` → Redis Streams; ``redis+pubsub://`` → Synkro-compatible
    pub/sub; ``kafka://host:port[,host:port]`` → Kafka; ``memory://`` → in-process."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return MemoryTransport(options.pop("broker", None))
    if scheme in ("redis", "rediss"):
        from debatebus.transports.redis_streams import RedisStreamsTransport

        return RedisStreamsTransport(url, **options)
    if scheme in ("redis+pubsub", "rediss+pubsub"):
        from debatebus.transports.redis_pubsub import RedisPubSubTransport

        return RedisPubSubTransport(url.replace("+pubsub", "", 1), **options)
    if scheme == "kafka":
        from debatebus.transports.kafka import KafkaTransport

        hosts = url.split("://", 1)[1].split("/", 1)[0]
        return KafkaTransport([h for h in hosts.split(",") if h], **options)
    raise ConfigError(f"unsupported broker URL {url!r}: use one of {', '.join(SCHEMES)}")
