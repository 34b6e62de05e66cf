"""Host a debate handler in an existing FastStream app, in one line per event type::

    broker = RedisBroker("redis://localhost:6379")
    app = FastStream(broker)
    mount(broker, "debate:request", debate.as_handler(store=store))          # pub/sub channel
    mount(broker, StreamSub("debate:request", group="debatebus", consumer="w1", last_id="0"),
          debate.as_handler(store=store))                                      # Redis Streams
    mount(kafka_broker, "debate:request", debate.as_handler(store=store))    # Kafka

Requests and results are debatebus's JSON envelopes on debatebus's channels, streams and topics,
answered as a ``DebateBus`` worker answers them (``host``): ``event:{type}:completed`` /
``…:failed``, bad input as a ``:failed`` event (a dead letter when no requestId can be read),
and the handler's checkpoint store for resuming and for answering duplicates. What a FastStream
host does not do that a worker does (events, observers, size limits, atomic settles) is listed
in docs/embedding.md.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from debatebus.exceptions import ConfigError
from debatebus.handlers._contract import Handler, adapt
from debatebus.handlers._handler import DebateHandler, no_default_store_warning

if TYPE_CHECKING:
    from faststream.kafka import KafkaBroker
    from faststream.redis import RedisBroker, StreamSub

__all__ = ["mount"]

log = logging.getLogger("debatebus.integrations.faststream")


def mount(broker: RedisBroker | KafkaBroker, source: str | StreamSub[Any], handler: Handler, *,
          group: str = "debatebus", stream_field: str = "envelope",
          subscriber_options: Mapping[str, Any] | None = None) -> None:
    """Answer the requests of ``source`` with ``handler``, before the broker starts.

    ``source``: an event type (a Redis pub/sub channel; on Kafka, its topic read in consumer
    group ``group``), or a ``StreamSub`` naming a Redis stream (its ``group``/``consumer`` are
    FastStream's; on a ``RedisClusterBroker`` it reads the event type's cluster key, and results
    and dead letters go to theirs). ``stream_field``: the Streams entry field holding the
    envelope, read and written (``"__data__"`` is FastStream's own). ``subscriber_options`` go to
    ``broker.subscriber`` (e.g. ``max_workers`` to answer several requests at once).

    A ``DebateHandler`` needs a store given to it (``as_handler(store=...)``): unlike
    ``DebateBus``, a FastStream broker has no URL to choose a default store from."""
    if isinstance(handler, DebateHandler) and handler.wants_default_store:
        log.warning(no_default_store_warning(f"{handler.name!r} is hosted by FastStream"))
    handle, options = adapt(handler), dict(subscriber_options or {})
    redis = sys.modules.get("faststream.redis")
    if redis is not None and isinstance(broker, redis.RedisBroker):
        from debatebus.integrations.faststream._redis_host import mount_redis

        mount_redis(broker, source, handle, stream_field, options)
        return
    kafka = sys.modules.get("faststream.kafka")
    if kafka is not None and isinstance(broker, kafka.KafkaBroker):
        if not isinstance(source, str):
            raise ConfigError(f"a KafkaBroker takes an event type, not {source!r}")
        from debatebus.integrations.faststream._kafka_host import mount_kafka

        mount_kafka(broker, source, handle, group, options)
        return
    raise ConfigError(f"mount() takes a FastStream RedisBroker or KafkaBroker, not "
                      f"{type(broker).__name__}")
