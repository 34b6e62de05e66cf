"""Mounting a handler on a FastStream ``RedisBroker``: a pub/sub channel or a Stream.

Bodies are the JSON envelope, both ways (``JSONMessageFormat``), never FastStream's binary
format. On Streams the envelope is the entry field ``stream_field``: debatebus's ``envelope`` by
default, so debatebus producers, workers and ``debatebus tail`` read what the host writes; with
``"__data__"`` (FastStream's field) results go through FastStream's own publishers instead.
Requests are read from either field. Dead letters are always debatebus's entries of
``{type}:dlq`` (``envelope``, ``key``, ``reason``, ``origin``, ``originId``, ``deliveries``).

On a ``RedisClusterBroker`` every stream is named by debatebus's cluster rule
(``debatebus._redis.cluster_key``), as a debatebus worker on ``?cluster=true`` names them: the
``StreamSub`` given by event type (``debate:request``) reads ``{debate:request}``, results go to
``event:{debate:request}:completed`` and dead letters to ``{debate:request}:dlq``. Pub/sub
channels keep their names.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final

import faststream.redis
from faststream import AckPolicy, Context
from faststream.message import StreamMessage
from faststream.redis import BinaryMessageFormatV1, RedisBroker, StreamSub
from faststream.redis.parser import MessageFormat
from redis.typing import EncodableT, FieldT

from debatebus._loops import PerLoop
from debatebus._redis import stream_key_rule
from debatebus.handlers._contract import Handle
from debatebus.integrations.faststream._host import Host, raw_body
from debatebus.schemas.envelope import completed_topic, failed_topic
from debatebus.transports._base import Delivery, Outgoing, dlq_topic
from debatebus.transports._redis_entries import ENVELOPE, KEY

#: The Streams entry field FastStream reads and writes.
FASTSTREAM_FIELD: Final = "__data__"
_FASTSTREAM_FIELD_BYTES: Final = FASTSTREAM_FIELD.encode()
#: FastStream's cluster broker (a ``RedisBroker``); None in a FastStream release without one.
_CLUSTER_BROKER: type[RedisBroker] | None = getattr(faststream.redis, "RedisClusterBroker", None)
#: Results and dead letters written at once, at most: each takes one of the broker's pool
#: connections (redis-py's holds 100, shared with the subscribers) while it is written.
_WRITES_AT_ONCE: Final = 32

Parser = Callable[[Mapping[str, Any]], Awaitable[StreamMessage[Any]]]


class JSONMessageFormat(MessageFormat):
    """The body as it is: plain JSON, without FastStream's headers (debatebus's live inside the
    envelope). Reading, a body in FastStream's binary format is unwrapped, so a FastStream
    producer left on the default format can still send requests."""

    @classmethod
    async def encode(cls, *, message: Any, reply_to: str | None, headers: dict[str, Any] | None,
                     correlation_id: str, serializer: Any = None, codec: Any = None) -> bytes:
        built = await cls.build(message=message, reply_to=reply_to, headers=headers,
                                correlation_id=correlation_id, serializer=serializer, codec=codec)
        return built.data

    @classmethod
    def parse(cls, data: bytes) -> tuple[bytes, dict[str, Any]]:
        if data.startswith(BinaryMessageFormatV1.IDENTITY_HEADER):
            return BinaryMessageFormatV1.parse(data)
        return data, {}


@dataclass(frozen=True, slots=True)
class _RedisWire:
    broker: RedisBroker
    #: Publishes a result on its topic through FastStream; None: written with XADD instead.
    publish: Callable[[Outgoing], Awaitable[Any]] | None
    stream_field: bytes
    #: A topic's stream key: ``cluster_key`` on a ``RedisClusterBroker``, the topic otherwise.
    key: Callable[[str], str]
    #: Bounds the writes under way (``_WRITES_AT_ONCE``): with more handlers finishing at once
    #: than the pool holds, the rest failed "Too many connections" and their requests stayed
    #: pending.
    writes: PerLoop[asyncio.Semaphore] = field(
        default_factory=lambda: PerLoop(lambda: asyncio.Semaphore(_WRITES_AT_ONCE)))

    async def answer(self, message: Outgoing) -> None:
        async with self.writes.get():
            if self.publish is not None:
                await self.publish(message)
                return
            fields: dict[FieldT, EncodableT] = {self.stream_field: message.body}
            if message.key is not None:
                fields[KEY] = message.key.encode()
            client = await self.broker.connect()
            await client.xadd(self.key(message.topic), fields)

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        fields: dict[FieldT, EncodableT] = {
            ENVELOPE: delivery.body, b"reason": reason, b"origin": delivery.topic,
            b"originId": delivery.id, b"deliveries": delivery.deliveries}
        async with self.writes.get():
            client = await self.broker.connect()
            await client.xadd(self.key(dlq_topic(delivery.topic)), fields)


def mount_redis(broker: RedisBroker, source: str | StreamSub[Any], handle: Handle,
                stream_field: str, options: Mapping[str, Any]) -> None:
    """Serve ``handle`` on ``source`` (a channel, or a ``StreamSub`` named by event type);
    ``options`` go to ``broker.subscriber``."""
    key = stream_key_rule(_CLUSTER_BROKER is not None and isinstance(broker, _CLUSTER_BROKER))
    channel, stream = (source, None) if isinstance(source, str) else (None, _keyed(source, key))
    event_type = source if isinstance(source, str) else source.name
    is_stream = stream is not None
    field = stream_field.encode()
    publishers = {topic: (broker.publisher(stream=key(topic), message_format=JSONMessageFormat)
                          if is_stream else
                          broker.publisher(topic, message_format=JSONMessageFormat))
                  for topic in (completed_topic(event_type), failed_topic(event_type))}

    async def publish(message: Outgoing) -> None:
        await publishers[message.topic].publish(message.body)

    through_faststream = not is_stream or field == _FASTSTREAM_FIELD_BYTES
    host = Host(handle, _RedisWire(broker, publish if through_faststream else None, field, key))

    async def on_request(message: Annotated[StreamMessage[Any], Context("message")]) -> None:
        await host.serve(Delivery(event_type, message.body, _entry_id(message.raw_message)))

    if is_stream:  # a request whose answer could not be published stays pending, to be claimed
        options = {"ack_policy": AckPolicy.NACK_ON_ERROR, **options}
    subscriber = broker.subscriber(
        channel,
        stream=stream,
        message_format=JSONMessageFormat,
        parser=_stream_parser(field) if is_stream else None,
        decoder=raw_body,
        no_reply=True,
        **options,
    )
    subscriber(on_request)


def _keyed(source: StreamSub[Any], key: Callable[[str], str]) -> StreamSub[Any]:
    """``source`` reading the stream key of its event type (a copy, when that is another name)."""
    if key(source.name) == source.name:
        return source
    keyed = copy.copy(source)
    keyed.name = key(source.name)
    return keyed


def _entry_id(raw: Mapping[str, Any]) -> str:
    ids = raw.get("message_ids")
    return ids[0].decode() if ids else ""


def _stream_parser(field: bytes) -> Callable[[Mapping[str, Any], Parser],
                                             Awaitable[StreamMessage[Any]]]:
    """Reads the envelope from ``field`` (else FastStream's own field) of a Streams entry."""

    async def parse(message: Mapping[str, Any], original: Parser) -> StreamMessage[Any]:
        body = message["data"].get(field)
        if body is not None and field != _FASTSTREAM_FIELD_BYTES:
            message = {**message, "data": {_FASTSTREAM_FIELD_BYTES: body}}
        return await original(message)

    return parse
