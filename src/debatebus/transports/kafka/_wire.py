"""How debatebus messages look on Kafka: records ⇄ ``Delivery``.

Topic = the event type with ``:`` replaced by ``.`` (``names.kafka_topic``: Kafka forbids ``:``);
key = the requestId; value = the JSON envelope; headers ``content-type: application/json`` and
``x-debatebus-schema-version`` plus the message's own. A dead letter is a new record on
``{topic}:dlq`` carrying its origin and reason in ``x-debatebus-*`` headers.

Delivery counts are the consuming member's own (see ``group``), never a header: a producer
controls headers, so ``x-debatebus-deliveries`` (which earlier versions wrote on requeued copies)
is dropped from consumed records, and so from dead letters and replays built from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from aiokafka import TopicPartition
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from debatebus.exceptions import ConfigError
from debatebus.schemas.envelope import SCHEMA_VERSION
from debatebus.transports._base import (
    DEAD_LETTER_HEADERS,
    DELIVERIES_HEADER,
    ORIGIN_HEADER,
    ORIGIN_OFFSET_HEADER,
    ORIGIN_PARTITION_HEADER,
    REASON_HEADER,
    Delivery,
    Outgoing,
    dlq_topic,
)
from debatebus.transports.kafka._names import (
    CONTENT_TYPE_HEADER,
    SCHEMA_HEADER,
    kafka_topic,
)
from debatebus.transports.kafka._offsets import Partition

RawHeaders = tuple[tuple[str, bytes], ...]


class Record(NamedTuple):
    topic: str
    value: bytes
    key: bytes | None
    headers: RawHeaders


class DeliveryOwner(Protocol):
    """The consumer-group member a delivery came from (``group.Member``): what settling it, handing
    it out again, or lending its slot out, takes."""

    @property
    def names(self) -> dict[str, str]: ...

    def settle(self, token: Token) -> bool: ...

    def is_settled(self, token: Token) -> bool: ...

    def release(self, delivery: Delivery) -> None: ...

    def lend(self, token: Token, lent: bool) -> None: ...

    async def commit(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Token:
    tp: TopicPartition
    offset: int
    raw_key: bytes | None
    raw_headers: RawHeaders
    member: DeliveryOwner | None = None  # None: from subscribe/read_range, nothing to settle
    partition: Partition | None = None


def _encode_headers(headers: dict[str, str]) -> RawHeaders:
    return tuple((k, v.encode()) for k, v in headers.items())


def to_record(message: Outgoing) -> Record:
    headers = {CONTENT_TYPE_HEADER: "application/json", SCHEMA_HEADER: str(SCHEMA_VERSION),
               **message.headers}
    key = message.key.encode() if message.key is not None else None
    return Record(kafka_topic(message.topic), message.body, key, _encode_headers(headers))


def to_delivery(record: Any, event_type: str, member: DeliveryOwner | None = None,
             partition: Partition | None = None) -> Delivery:
    """A first delivery of ``record``: the member counts the ones after it."""
    raw: RawHeaders = tuple((k, v or b"") for k, v in record.headers or ()
                            if k != DELIVERIES_HEADER)
    headers = {k: v.decode("utf-8", "replace") for k, v in raw}
    key = record.key.decode("utf-8", "replace") if record.key is not None else None
    tp = TopicPartition(record.topic, record.partition)
    return Delivery(event_type, record.value or b"", f"{record.partition}:{record.offset}", 1,
                    key, headers, token=Token(tp, record.offset, record.key, raw, member,
                                              partition))


def dead_letter(delivery: Delivery, token: Token, reason: str) -> Record:
    headers = [h for h in token.raw_headers if h[0] not in DEAD_LETTER_HEADERS]
    headers += [(REASON_HEADER, reason.encode()), (ORIGIN_HEADER, delivery.topic.encode()),
                (ORIGIN_PARTITION_HEADER, str(token.tp.partition).encode()),
                (ORIGIN_OFFSET_HEADER, str(token.offset).encode())]
    topic = kafka_topic(dlq_topic(delivery.topic))
    return Record(topic, delivery.body, token.raw_key, tuple(headers))


def token_of(delivery: Delivery) -> Token:
    if not isinstance(delivery.token, Token):
        raise ConfigError("this delivery did not come from a KafkaTransport: settle it with the "
                          "transport that delivered it")
    return delivery.token


def size_of(record: Record) -> int:
    """The bound aiokafka checks against ``max_request_size`` before producing ``record``."""
    size: int = DefaultRecordBatchBuilder.estimate_size_in_bytes(record.key, record.value,
                                                                  list(record.headers))
    return size
