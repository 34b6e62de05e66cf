"""One factory per transport implementation (the Redis ones also on a cluster); the contract suite
runs against each of them. And the Kafka transport factory the Kafka-only tests share."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from tests.support.servers import TansuServer
from tests.support.transports import GROUP_OPTIONS, Kind, with_protocol

from debatebus.transports._base import Transport
from debatebus.transports._memory import MemoryBroker, MemoryTransport
from debatebus.transports._redis_pubsub import RedisPubSubTransport
from debatebus.transports._redis_streams import RedisStreamsTransport
from debatebus.transports.kafka import KafkaTransport

#: The Redis transports twice: over RESP2 and RESP3 (``?protocol=3``), whose replies redis-py
#: shapes differently (XREAD/XREADGROUP: a list of pairs, or a dict).
#: Then both over the session's 3-master Redis Cluster.
KINDS = ["memory", "redis_streams-resp2", "redis_streams-resp3", "redis_pubsub-resp2",
         "redis_pubsub-resp3", "redis_streams-cluster", "redis_pubsub-cluster", "kafka"]


def _memory(request: pytest.FixtureRequest) -> Kind:
    broker = MemoryBroker(claim_idle_s=0.3)
    return Kind("memory", lambda: MemoryTransport(broker), redelivery_wait=0.3)


def _redis_streams(protocol: int) -> Callable[[pytest.FixtureRequest], Kind]:
    def make(request: pytest.FixtureRequest) -> Kind:
        url = with_protocol(request.getfixturevalue("redis_server").url, protocol)
        return Kind(
            "redis_streams",
            lambda: RedisStreamsTransport(url, claim_idle_ms=500, block_ms=100),
            redelivery_wait=0.5,
        )
    return make


def _redis_pubsub(protocol: int) -> Callable[[pytest.FixtureRequest], Kind]:
    def make(request: pytest.FixtureRequest) -> Kind:
        url = with_protocol(request.getfixturevalue("redis_server").url, protocol)
        return Kind("redis_pubsub", lambda: RedisPubSubTransport(url), durable=False,
                    groups=False, metadata=False)
    return make


def _redis_cluster_streams(request: pytest.FixtureRequest) -> Kind:
    url = request.getfixturevalue("redis_cluster").url
    return Kind("redis_streams", lambda: RedisStreamsTransport(url, claim_idle_ms=500, block_ms=100),
                redelivery_wait=0.5)


def _redis_cluster_pubsub(request: pytest.FixtureRequest) -> Kind:
    url = request.getfixturevalue("redis_cluster").url
    return Kind("redis_pubsub", lambda: RedisPubSubTransport(url), durable=False, groups=False,
                metadata=False)


def _kafka(request: pytest.FixtureRequest) -> Kind:
    server = request.getfixturevalue("tansu_server")
    return Kind(
        "kafka",
        lambda: KafkaTransport(server.bootstrap, session_timeout_ms=2000,
                               heartbeat_interval_ms=500),
        redelivery_wait=3.0,
    )


_MAKERS = {"memory": _memory, "redis_streams-resp2": _redis_streams(2),
           "redis_streams-resp3": _redis_streams(3), "redis_pubsub-resp2": _redis_pubsub(2),
           "redis_pubsub-resp3": _redis_pubsub(3), "redis_streams-cluster": _redis_cluster_streams,
           "redis_pubsub-cluster": _redis_cluster_pubsub, "kafka": _kafka}


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


@pytest.fixture
def make(tansu_server: TansuServer) -> Callable[..., KafkaTransport]:
    def build(**options: Any) -> KafkaTransport:
        return KafkaTransport(tansu_server.bootstrap, **{**GROUP_OPTIONS, **options})

    return build


@pytest.fixture
def group() -> str:
    """A group per test. Sharing one across tests on the session's broker would couple them, and
    Tansu 0.6 strands a group whose leader was the last member to leave: the next member to
    join is told the departed leader leads and never gets an assignment."""
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def kafka(make: Callable[..., KafkaTransport]) -> AsyncIterator[KafkaTransport]:
    async with make() as t:
        yield t
