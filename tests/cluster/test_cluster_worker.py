"""A worker process SIGKILLed mid-debate on the Redis Cluster, and another resuming its debates
from the checkpoint store on the same cluster (``store_from_url`` of the ``?cluster=true`` URL,
with a short lease so the takeover is quick). The URL names every master as a seed, after one
that does not answer, as an operator's would."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster
from tests.support.cluster import RedisClusterServers
from tests.support.processes import (
    WorkerProcess,
    collecting,
    committed_round_reruns,
    env_for,
    read_calls,
    wait_until,
)
from tests.support.quiet import settled_stream_group, streams_read
from tests.support.servers import free_port

from debatebus._redis import cluster_key
from debatebus.schemas.envelope import completed_topic, failed_topic

pytestmark = [pytest.mark.slow, pytest.mark.redis]

DEBATES = 4
ROUNDS = 3


async def test_a_killed_workers_debates_resume_on_another_worker(
        redis_cluster: RedisClusterServers, tmp_path: Path) -> None:
    seeds = ",".join(f"127.0.0.1:{port}" for port in [free_port(), *redis_cluster.ports])
    url = f"redis://{seeds}/0?cluster=true"
    event_type = f"debate:cluster{uuid.uuid4().hex[:6]}"
    calls = tmp_path / "calls.log"
    env = env_for(url, event_type, tmp_path, DBB_DELAY="0.2", DBB_ROUNDS=ROUNDS, DBB_STORE=url,
                  DBB_LEASE_TTL="1.5", DBB_CLAIM_IDLE_MS="1500")
    workers = [WorkerProcess(env, tmp_path / "first.log")]
    try:
        async with collecting(url, event_type) as (client, collector):
            ids = [await client.publish(event_type, {"input": f"cluster {i}"},
                                        request_id=f"{event_type}-{i}") for i in range(DEBATES)]
            # Past the first round of some debate (framing + 2 turns + judge): a committed round.
            await asyncio.to_thread(wait_until, lambda: len(read_calls(calls)) >= 8, 60,
                                    "the first worker to be mid-debate")
            workers[0].kill()
            killed = workers[0].pid
            workers.append(WorkerProcess(env, tmp_path / "second.log"))
            await collector.wait_for(ids, 120)
            # Every request delivered and acked: none can run again, and a duplicate's result
            # was written before that; then the collector has read every result there is.
            probe = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", port)
                                                for port in redis_cluster.ports])
            try:
                await settled_stream_group(probe, cluster_key(event_type), env["DBB_GROUP"])
                await streams_read(probe, [cluster_key(completed_topic(event_type)),
                                           cluster_key(failed_topic(event_type))],
                                   lambda: len(collector.results))
            finally:
                await probe.aclose()
    finally:
        for worker in workers:
            worker.stop()
    counts = collector.counts()
    assert all(counts[i] == 1 for i in ids), f"results per request: {counts}"
    assert all(e.payload["debateStatus"] == "completed" for e in collector.results)
    made = read_calls(calls)
    by_question: dict[str, set[int]] = {}
    for call in made:
        by_question.setdefault(str(call["question"]), set()).add(int(str(call["pid"])))
    resumed = [q for q, pids in by_question.items() if pids == {killed, workers[1].pid}]
    assert resumed, f"no debate was begun by the killed worker and finished by the other: {by_question}"
    assert committed_round_reruns(calls) == {}, "a resumed debate ran a committed round again"
