"""One real 3-master Redis Cluster for the whole session (tests/support/cluster.py), and the
transport and checkpoint-store fixtures the shared contract suites take, pointed at it."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from tests.checkpoints.conftest import Backend, peer, store
from tests.support.cluster import RedisClusterServers
from tests.transports.conftest import Kind, topic, transport

from debatebus.checkpoints import RedisCheckpointStore
from debatebus.transports.redis_pubsub import RedisPubSubTransport
from debatebus.transports.redis_streams import RedisStreamsTransport

pytestmark = pytest.mark.redis
# The contract suites' own fixtures over ``kind`` and ``backend`` (defined below for the cluster).
__all__ = ["peer", "store", "topic", "transport"]


@pytest.fixture(params=["redis_streams", "redis_pubsub"])
def kind(request: pytest.FixtureRequest, redis_cluster: RedisClusterServers) -> Kind:
    url = redis_cluster.url
    if request.param == "redis_pubsub":
        return Kind("redis_pubsub", lambda: RedisPubSubTransport(url), durable=False,
                    groups=False, metadata=False)
    return Kind("redis_streams", lambda: RedisStreamsTransport(url, claim_idle_ms=500, block_ms=100),
                redelivery_wait=0.5)


@pytest.fixture
def backend(redis_cluster: RedisClusterServers, tmp_path: Path) -> Backend:
    url, prefix = redis_cluster.url, f"test-{uuid.uuid4().hex[:12]}"
    return Backend("redis", lambda: RedisCheckpointStore(url, prefix=prefix), durable=True,
                   retained=lambda s: RedisCheckpointStore(url, prefix=prefix, retention_s=s))
