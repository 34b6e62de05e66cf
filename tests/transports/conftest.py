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


#: The Redis transports twice: over RESP2 and RESP3 (``?protocol=3``), whose replies redis-py
#: shapes differently (XREAD/XREADGROUP: a list of pairs, or a dict).
KINDS = ["memory", "redis_streams-resp2", "redis_streams-resp3", "redis_pubsub-resp2",
         "redis_pubsub-resp3", "kafka"]


def with_protocol(url: str, protocol: int) -> str:
    """``url`` with the RESP version redis-py must speak (``?protocol=N``)."""
    return f"{url}{'&' if '?' in url else '?'}protocol={protocol}"


def _memory(request: pytest.FixtureRequest) -> Kind:
    broker = MemoryBroker(claim_idle_s=0.3)
    return Kind("memory", lambda: MemoryTransport(broker), redelivery_wait=0.3)


def _redis_streams(protocol: int) -> Callable[[pytest.FixtureRequest], Kind]:
    def make(request: pytest.FixtureRequest) -> Kind:
        from debatebus.transports.redis_streams import RedisStreamsTransport

        url = with_protocol(request.getfixturevalue("redis_server").url, protocol)
        return Kind(
            "redis_streams",
            lambda: RedisStreamsTransport(url, claim_idle_ms=500, block_ms=100),
            redelivery_wait=0.5,
        )
    return make


def _redis_pubsub(protocol: int) -> Callable[[pytest.FixtureRequest], Kind]:
    def make(request: pytest.FixtureRequest) -> Kind:
        from debatebus.transports.redis_pubsub import RedisPubSubTransport

        url = with_protocol(request.getfixturevalue("redis_server").url, protocol)
        return Kind("redis_pubsub", lambda: RedisPubSubTransport(url), durable=False,
                    groups=False, metadata=False)
    return make


def _kafka(request: pytest.FixtureRequest) -> Kind:
    from debatebus.transports.kafka import KafkaTransport

    server = request.getfixturevalue("tansu_server")
    return Kind(
        "kafka",
        lambda: KafkaTransport(server.bootstrap, session_timeout_ms=2000,
                               heartbeat_interval_ms=500),
        redelivery_wait=3.0,
    )


_MAKERS = {"memory": _memory, "redis_streams-resp2": _redis_streams(2),
           "redis_streams-resp3": _redis_streams(3), "redis_pubsub-resp2": _redis_pubsub(2),
           "redis_pubsub-resp3": _redis_pubsub(3), "kafka": _kafka}


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def redis_url(request: pytest.FixtureRequest) -> str:
    """The session's redis-server over RESP2, then over RESP3."""
    return with_protocol(request.getfixturevalue("redis_server").url, request.param)


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
