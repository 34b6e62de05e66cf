"""One factory per transport implementation; the contract suite runs against each of them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from debatebus.transports.base import Transport
from debatebus.transports.memory import MemoryBroker, MemoryTransport


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


KINDS = ["memory", "redis_streams", "redis_pubsub", "kafka"]


def _memory(request: pytest.FixtureRequest) -> Kind:
    broker = MemoryBroker(claim_idle_s=0.3)
    return Kind("memory", lambda: MemoryTransport(broker), redelivery_wait=0.3)


def _redis_streams(request: pytest.FixtureRequest) -> Kind:
    from debatebus.transports.redis_streams import RedisStreamsTransport

    server = request.getfixturevalue("redis_server")
    return Kind(
        "redis_streams",
        lambda: RedisStreamsTransport(server.url, claim_idle_ms=500, block_ms=100),
        redelivery_wait=0.5,
    )


def _redis_pubsub(request: pytest.FixtureRequest) -> Kind:
    from debatebus.transports.redis_pubsub import RedisPubSubTransport

    server = request.getfixturevalue("redis_server")
    return Kind("redis_pubsub", lambda: RedisPubSubTransport(server.url), durable=False,
                groups=False, metadata=False)


def _kafka(request: pytest.FixtureRequest) -> Kind:
    from debatebus.transports.kafka import KafkaTransport

    server = request.getfixturevalue("tansu_server")
    return Kind(
        "kafka",
        lambda: KafkaTransport(server.bootstrap, session_timeout_ms=2000,
                               heartbeat_interval_ms=500),
        redelivery_wait=3.0,
    )


_MAKERS = {"memory": _memory, "redis_streams": _redis_streams, "redis_pubsub": _redis_pubsub,
           "kafka": _kafka}


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> Kind:
    return _MAKERS[request.param](request)


@pytest.fixture
def topic() -> str:
    """A fresh event type per test, with the ':' that real event types carry."""
    return f"test:{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def transport(kind: Kind) -> AsyncIterator[Transport]:
    async with kind.make() as t:
        yield t
