"""How debatebus messages look on Kafka: topic names, headers, and records ⇄ ``Delivery``.

Topic = the event type with ``:`` replaced by ``.`` (Kafka forbids ``:``); key = the requestId;
value = the JSON envelope; headers ``content-type: application/json`` and
``x-debatebus-schema-version`` plus the message's own. A dead letter is a new record on
``{topic}:dlq`` carrying its origin and reason in ``x-debatebus-*`` headers.

Delivery counts are the consuming member's own (see ``kafka_group``), never a header: a producer
controls headers, so ``x-debatebus-deliveries`` (which earlier versions wrote on requeued copies)
is dropped from consumed records, and so from dead letters and replays built from them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from aiokafka import TopicPartition
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from debatebus.exceptions import ConfigError
from debatebus.schemas.envelope import SCHEMA_VERSION
from debatebus.transports.base import Delivery, Outgoing, dlq_topic

if TYPE_CHECKING:  # kafka_group imports this module, so importing it back must wait for types
    from debatebus.transports.kafka_group import _Member, _Partition

__all__ = [
    "CONTENT_TYPE_HEADER",
    "DELIVERIES_HEADER",
    "ORIGIN_HEADER",
    "ORIGIN_OFFSET_HEADER",
    "ORIGIN_PARTITION_HEADER",
    "REASON_HEADER",
    "SCHEMA_HEADER",
    "kafka_topic",
]

CONTENT_TYPE_HEADER: Final = "content-type"
SCHEMA_HEADER: Final = "x-debatebus-schema-version"
REASON_HEADER: Final = "x-debatebus-reason"
DELIVERIES_HEADER: Final = "x-debatebus-deliveries"  # never trusted: dropped when consumed
ORIGIN_HEADER: Final = "x-debatebus-origin"
ORIGIN_PARTITION_HEADER: Final = "x-debatebus-origin-partition"
ORIGIN_OFFSET_HEADER: Final = "x-debatebus-origin-offset"
_DLQ_HEADERS: Final = frozenset({REASON_HEADER, ORIGIN_HEADER, ORIGIN_PARTITION_HEADER,
                                 ORIGIN_OFFSET_HEADER})

_LEGAL_TOPIC: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")

RawHeaders = tuple[tuple[str, bytes], ...]


@functools.lru_cache(maxsize=1024)
def kafka_topic(event_type: str) -> str:
    """The Kafka topic carrying ``event_type``: ``debate:request`` → ``debate.request``."""
    name = event_type.replace(":", ".")
    if not _LEGAL_TOPIC.fullmatch(name) or name in (".", ".."):
        raise ConfigError(f"event type {event_type!r} maps to Kafka topic {name!r}, which Kafka "
                          "rejects: use letters, digits and . _ - : only, at most 249 characters")
    return name


def _names(topics: Sequence[str]) -> dict[str, str]:
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


def _encode_headers(headers: dict[str, str]) -> RawHeaders:
    return tuple((k, v.encode()) for k, v in headers.items())


class _Record(NamedTuple):
    topic: str
    value: bytes
    key: bytes | None
    headers: RawHeaders


def _outgoing(message: Outgoing) -> _Record:
    headers = {CONTENT_TYPE_HEADER: "application/json", SCHEMA_HEADER: str(SCHEMA_VERSION),
               **message.headers}
    key = message.key.encode() if message.key is not None else None
    return _Record(kafka_topic(message.topic), message.body, key, _encode_headers(headers))


@dataclass(frozen=True, slots=True)
class _Token:
    tp: TopicPartition
    offset: int
    raw_key: bytes | None
    raw_headers: RawHeaders
    member: _Member | None = None  # None: from subscribe/read_range, nothing to settle
    partition: _Partition | None = None


def _delivery(record: Any, event_type: str, member: _Member | None = None,
              partition: _Partition | None = None) -> Delivery:
    """A first delivery of ``record``: the member counts the ones after it."""
    raw: RawHeaders = tuple((k, v or b"") for k, v in record.headers or ()
                            if k != DELIVERIES_HEADER)
    headers = {k: v.decode("utf-8", "replace") for k, v in raw}
    key = record.key.decode("utf-8", "replace") if record.key is not None else None
    tp = TopicPartition(record.topic, record.partition)
    return Delivery(event_type, record.value or b"", f"{record.partition}:{record.offset}", 1,
                    key, headers, token=_Token(tp, record.offset, record.key, raw, member,
                                               partition))


def _dead_letter(delivery: Delivery, token: _Token, reason: str) -> _Record:
    headers = [h for h in token.raw_headers if h[0] not in _DLQ_HEADERS]
    headers += [(REASON_HEADER, reason.encode()), (ORIGIN_HEADER, delivery.topic.encode()),
                (ORIGIN_PARTITION_HEADER, str(token.tp.partition).encode()),
                (ORIGIN_OFFSET_HEADER, str(token.offset).encode())]
    topic = kafka_topic(dlq_topic(delivery.topic))
    return _Record(topic, delivery.body, token.raw_key, tuple(headers))


def _token_of(delivery: Delivery) -> _Token:
    if not isinstance(delivery.token, _Token):
        raise ConfigError("this delivery did not come from a KafkaTransport: settle it with the "
                          "transport that delivered it")
    return delivery.token


def _size_of(record: _Record) -> int:
    """The bound aiokafka checks against ``max_request_size`` before producing ``record``."""
    size: int = DefaultRecordBatchBuilder.estimate_size_in_bytes(record.key, record.value,
                                                                  list(record.headers))
    return size
