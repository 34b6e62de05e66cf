"""Mounting a handler on a FastStream ``KafkaBroker``: debatebus's Kafka wire.

Topics are the event types with ``:`` as ``.`` (``debate:request`` → ``debate.request``), values
the JSON envelope, keys the request id, headers ``content-type`` and the schema version, as a
debatebus Kafka worker writes and reads them (``debatebus.transports.kafka._wire``), dead
letters included (the original record on the topic of ``{type}:dlq``, with ``x-debatebus-*``
headers saying why and where from).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from faststream import AckPolicy, Context
from faststream.kafka import KafkaBroker
from faststream.message import StreamMessage

from debatebus.handlers._contract import Handle
from debatebus.integrations.faststream._host import Host, raw_body
from debatebus.transports._base import Delivery, Outgoing
from debatebus.transports.kafka._names import kafka_topic
from debatebus.transports.kafka._wire import Record, dead_letter, to_delivery, to_record, token_of


@dataclass(frozen=True, slots=True)
class _KafkaWire:
    broker: KafkaBroker

    async def answer(self, message: Outgoing) -> None:
        await self._publish(to_record(message))

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        await self._publish(dead_letter(delivery, token_of(delivery), reason))

    async def _publish(self, record: Record) -> None:
        await self.broker.publish(record.value, record.topic, key=record.key,
                                  headers={name: value.decode() for name, value in record.headers})


def mount_kafka(broker: KafkaBroker, event_type: str, handle: Handle, group: str,
                options: Mapping[str, Any]) -> None:
    """Serve ``handle`` on the topic of ``event_type`` in consumer group ``group``; ``options``
    go to ``broker.subscriber``."""
    host = Host(handle, _KafkaWire(broker))

    async def on_request(message: Annotated[StreamMessage[Any], Context("message")]) -> None:
        await host.serve(to_delivery(message.raw_message, event_type))

    subscriber = broker.subscriber(
        kafka_topic(event_type),
        group_id=group,
        auto_offset_reset="earliest",
        decoder=raw_body,
        ack_policy=AckPolicy.NACK_ON_ERROR,
        no_reply=True,
        **options,
    )
    subscriber(on_request)
