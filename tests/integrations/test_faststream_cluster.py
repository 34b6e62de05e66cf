"""The FastStream host on a real 3-master Redis Cluster (``RedisClusterBroker``): its streams
follow debatebus's cluster key rule, so debatebus's own client (``?cluster=true``) and the host
meet on the same keys."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from faststream.redis import RedisClusterBroker, StreamSub

from debatebus._redis import cluster_key
from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.client import BusClient
from debatebus.integrations.faststream import mount
from debatebus.schemas.envelope import completed_topic
from debatebus.transports._base import dlq_topic
from tests.support.cluster import RedisClusterServers
from tests.support.faststream import counting_llm, debate

pytestmark = pytest.mark.redis


async def _entries(cluster: RedisClusterServers, key: str, count: int) -> list[dict[bytes, Any]]:
    sync = cluster.client()
    async with asyncio.timeout(10):
        while len(found := await asyncio.to_thread(sync.xrange, key)) < count:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    return [fields for _, fields in found]


async def _pending_once_acked(cluster: RedisClusterServers, key: str, group: str) -> int:
    """How many of ``key``'s entries ``group`` has not acknowledged, once none or after 10 s:
    FastStream acknowledges after the handler returns, so the last ack may still be on its way
    (and must land before the broker stops)."""
    sync = cluster.client()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while (pending := (await asyncio.to_thread(sync.xpending, key, group))["pending"]) \
            and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return int(pending)


async def test_streams_host_on_a_cluster_uses_the_cluster_keys(
        redis_cluster: RedisClusterServers) -> None:
    event = f"debate:{uuid.uuid4().hex[:8]}"
    broker = RedisClusterBroker(f"redis://127.0.0.1:{redis_cluster.ports[0]}")
    handler = debate(counting_llm()).as_handler(store=MemoryCheckpointStore())
    mount(broker, StreamSub(event, group="debatebus", consumer="w1", last_id="0"), handler)
    async with broker, BusClient(redis_cluster.url) as bus:
        await broker.start()
        answer = await bus.request(event, {"input": "Tabs or spaces?"}, timeout=30)
        await asyncio.to_thread(redis_cluster.client().xadd, cluster_key(event), {"envelope": b"{"})
        (dead,) = await _entries(redis_cluster, cluster_key(dlq_topic(event)), 1)
        pending = await _pending_once_acked(redis_cluster, cluster_key(event), "debatebus")
    assert answer.payload["debateStatus"] == "completed"
    assert cluster_key(event) == f"{{{event}}}"
    (result,) = await _entries(redis_cluster, cluster_key(completed_topic(event)), 1)
    assert json.loads(result[b"envelope"])["type"] == completed_topic(event)  # the event type's
    assert dead[b"envelope"] == b"{" and dead[b"origin"] == event.encode()
    sync = redis_cluster.client()
    assert not sync.exists(event, completed_topic(event), dlq_topic(event)), \
        "single-node names are not used on a cluster"
    assert pending == 0  # both requests acknowledged


async def test_pubsub_host_on_a_cluster_keeps_channels_and_dead_letters_by_cluster_key(
        redis_cluster: RedisClusterServers) -> None:
    event = f"debate:{uuid.uuid4().hex[:8]}"
    broker = RedisClusterBroker(f"redis://127.0.0.1:{redis_cluster.ports[0]}")
    mount(broker, event, debate(counting_llm()).as_handler(store=MemoryCheckpointStore()))
    url = redis_cluster.url.replace("redis://", "redis+pubsub://")
    async with broker, BusClient(url) as bus:
        await broker.start()
        async with asyncio.timeout(10):  # subscribed on some node of the cluster
            while not any(redis_cluster.node(port).pubsub_numsub(event)[0][1]  # noqa: ASYNC110
                          for port in redis_cluster.ports):
                await asyncio.sleep(0.05)
        answer = await bus.request(event, {"input": "Tabs or spaces?"}, timeout=30)
        await asyncio.to_thread(redis_cluster.client().publish, event, b"not json")
        (dead,) = await _entries(redis_cluster, cluster_key(dlq_topic(event)), 1)
    assert answer.payload["debateStatus"] == "completed"
    assert dead[b"envelope"] == b"not json" and dead[b"origin"] == event.encode()
    assert not redis_cluster.client().exists(dlq_topic(event))
