"""Names debatebus uses on Kafka: topics (from event types) and its own record headers (the
dead-letter headers are every transport's: ``transports.base``).

Imports nothing from aiokafka, so the AsyncAPI document can name the topics without it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Final

from debatebus.exceptions import ConfigError

CONTENT_TYPE_HEADER: Final = "content-type"
SCHEMA_HEADER: Final = "x-debatebus-schema-version"

_LEGAL_TOPIC: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")


@functools.lru_cache(maxsize=1024)
def kafka_topic(event_type: str) -> str:
    """The Kafka topic carrying ``event_type``: ``debate:request`` → ``debate.request``."""
    name = event_type.replace(":", ".")
    if not _LEGAL_TOPIC.fullmatch(name) or name in (".", ".."):
        raise ConfigError(f"event type {event_type!r} maps to Kafka topic {name!r}, which Kafka "
                          "rejects: use letters, digits and . _ - : only, at most 249 characters")
    return name


def topic_names(topics: Sequence[str]) -> dict[str, str]:
    """Kafka topic → the event type the caller used, to give deliveries their original names."""
    if isinstance(topics, str) or not topics:
        raise ConfigError(f"pass a non-empty list of event types, not {topics!r}")
    names: dict[str, str] = {}
    for event_type in topics:
        first = names.setdefault(kafka_topic(event_type), event_type)
        if first != event_type:
            raise ConfigError(f"event types {first!r} and {event_type!r} both map to Kafka topic "
                              f"{kafka_topic(first)!r}: rename one of them")
    return names
