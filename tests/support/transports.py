"""Transport test helpers: what a transport kind promises, the RESP version in a URL, a reader
that pumps deliveries into a queue, and the Kafka group settings and offset probe."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from debatebus.transports._base import Delivery, Outgoing, Transport
from debatebus.transports.kafka import kafka_topic
from tests.support.servers import TansuServer

TIMEOUT = 15.0
PROBE = b'{"probe":true}'
WAIT = 60.0  # generous: a group join on Tansu takes ~1 s, a crashed member's expiry ~2-4 s
GROUP_OPTIONS: dict[str, Any] = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}


@dataclass
class Kind:
    """What a transport can promise; the contract skips what a broker cannot do by design."""

    name: str
    make: Callable[[], Transport]
    durable: bool = True  # unsettled messages are redelivered; messages published before a
    # consumer exists are still delivered to it
    groups: bool = True  # consumers of one group share (not duplicate) the messages
    redelivery_wait: float = 0.0  # how long an abandoned delivery takes to come back
    metadata: bool = True  # key and headers travel beside the body (Synkro's pub/sub wire has
    # only the body: they live inside the envelope there)


def with_protocol(url: str, protocol: int) -> str:
    """``url`` with the RESP version redis-py must speak (``?protocol=N``)."""
    return f"{url}{'&' if '?' in url else '?'}protocol={protocol}"


class Reader:
    """Pumps a consume/subscribe iterator into a queue, so waiting with a timeout never cancels
    (and so closes) the iterator itself."""

    def __init__(self, it: AsyncIterator[Delivery]) -> None:
        self.queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self.task = asyncio.ensure_future(self._pump(it))

    async def _pump(self, it: AsyncIterator[Delivery]) -> None:
        async for delivery in it:
            await self.queue.put(delivery)

    async def next(self, timeout: float = TIMEOUT) -> Delivery:
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def nothing(self, within: float) -> None:
        try:
            got = await asyncio.wait_for(self.queue.get(), within)
        except TimeoutError:
            return
        raise AssertionError(f"expected nothing, got {got.body!r}")

    async def started(self, kind: Kind, t: Transport, topic: str) -> Delivery:
        """Prime the reader: at-most-once brokers drop what is published before it listens, and
        Kafka group joins take a moment, so publish probes until one arrives."""
        for _ in range(int(TIMEOUT / 0.25)):
            await t.publish(Outgoing(topic, PROBE))
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(self.queue.get(), 0.25)
        raise AssertionError(f"{kind.name}: nothing arrived on {topic}")

    async def drain_probes(self, t: Transport | None = None) -> None:
        """Skip (and settle) the extra probes that started() may have left behind."""
        with contextlib.suppress(TimeoutError):
            while True:
                d = await asyncio.wait_for(self.queue.get(), 0.5)
                assert d.body == PROBE, f"unexpected message while draining probes: {d.body!r}"
                if t is not None:
                    await t.ack(d)

    def stop(self) -> None:
        self.task.cancel()


async def committed(server: TansuServer, group: str, topic: str, partition: int = 0) -> int | None:
    """The group's committed offset, read by a consumer that does not join (so no rebalance)."""
    reader = AIOKafkaConsumer(bootstrap_servers=server.bootstrap, group_id=group,
                              enable_auto_commit=False)
    await reader.start()
    try:
        offset: int | None = await reader.committed(TopicPartition(kafka_topic(topic), partition))
        return offset
    finally:
        await reader.stop()
