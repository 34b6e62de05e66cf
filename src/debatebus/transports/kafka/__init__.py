"""Kafka transport (needs the ``kafka`` extra, aiokafka): ``KafkaTransport``, configured by a
``KafkaSettings``; ``kafka_topic`` and the header names say how messages look on Kafka.

The modules inside are private as a whole; each uses the others' plain names. They import in one
direction: ``names``, ``settings``, ``errors``, ``offsets`` ← ``wire``, ``topics`` ← ``group``,
``readers`` ← ``transport``. ``names`` and ``settings`` import nothing from aiokafka, and neither does this
module until ``KafkaTransport`` is asked for, so the topic names are known without aiokafka.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from debatebus.transports.kafka._names import (
    CONTENT_TYPE_HEADER,
    SCHEMA_HEADER,
    kafka_topic,
)
from debatebus.transports.kafka._settings import KafkaSettings

if TYPE_CHECKING:
    from debatebus.transports.kafka._transport import KafkaTransport

__all__ = [
    "CONTENT_TYPE_HEADER",
    "SCHEMA_HEADER",
    "KafkaSettings",
    "KafkaTransport",
    "kafka_topic",
]


def __getattr__(name: str) -> Any:
    """``KafkaTransport``, importing aiokafka on first use."""
    if name == "KafkaTransport":
        from debatebus.transports.kafka._transport import KafkaTransport

        return KafkaTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
