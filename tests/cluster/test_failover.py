"""A master SIGKILLed under a flow of requests, on a Redis Cluster with a replica per master
(``cluster-node-timeout`` 1 s): the replica is promoted, and every request is answered exactly
once, with nothing left pending and no future left with an unretrieved exception.

One worker serves the flow in the test's own loop: the Redis Streams transport, the Redis
checkpoint store and a fleet rate limiter (``RedisRateLimiter``), all on the cluster, the
request stream's slot and the limiter's bucket on the master that is killed. Phase one kills
that master mid-flow; phase two starts it again (it rejoins as a replica of the node that took
its slots), then kills the promoted node mid-flow, so that the slots go back to a node the
batchers forgot. Each phase prints what the failover cost (pytest -s shows it)."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tests.support.bus import make_debate, running
from tests.support.cluster import RedisClusterServers

from debatebus._redis import cluster_key
from debatebus._worker import DebateBus
from debatebus.checkpoints import RedisCheckpointStore
from debatebus.client import BusClient
from debatebus.handlers._contract import HandlerResult
from debatebus.llm import LLMRequest
from debatebus.llm._ratelimit import RateLimit, RateLimitedLLM
from debatebus.llm._ratelimit_redis import RedisRateLimiter
from debatebus.observability._observer import Observer, RequestContext, Settlement
from debatebus.schemas.envelope import completed_topic, failed_topic
from debatebus.testing import FunctionLLM

pytestmark = [pytest.mark.slow, pytest.mark.redis]

REQUESTS = 150
KILL_AFTER = 40  # answered in the phase before its master is killed: mid-flow
CALL_S = 0.04  # each model call
GROUP = "failover"
#: Every wait is bounded: the brief is "answered within a minute of the promotion".
ANSWERED_WITHIN_S = 60.0
OPTIONS = {"claim_idle_ms": 1500, "block_ms": 200, "command_timeout": 2.0, "connect_timeout": 1.0}


@pytest.fixture
def cluster() -> Iterator[RedisClusterServers]:
    """Three masters, a replica each, failing over about 2 s after a master dies."""
    servers = RedisClusterServers.start(3, replicas=1, node_timeout_ms=1000)
    try:
        yield servers
    finally:
        servers.stop()


class Settled(Observer):
    """When each request was settled (answered or dead-lettered), as the worker saw it."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.times: list[float] = []
        self.changed = asyncio.Event()

    def request_finished(self, ctx: RequestContext, outcome: Settlement,
                         result: HandlerResult | None, duration_s: float) -> None:
        if outcome != "unsettled" and ctx.request_id is not None:
            now = time.monotonic()
            self.at.setdefault(ctx.request_id, now)
            self.times.append(now)
            self.changed.set()

    async def wait(self, ids: list[str], count: int, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while sum(i in self.at for i in ids) < count:
                self.changed.clear()
                await self.changed.wait()


@dataclass
class Cost:
    """What one failover cost: the numbers the docs quote."""

    answered_once: int
    answered_twice: int
    lost: int
    pending: int
    not_completed: int
    calls_paid_twice: int
    kill_to_promotion_s: float
    kill_to_first_answer_s: float
    kill_to_last_answer_s: float


def _named_on(cluster: RedisClusterServers, port: int, key: Any) -> str:
    """A fresh name whose key (``key(name)``) lives on master ``port``."""
    while True:
        name = uuid.uuid4().hex[:8]
        if cluster.owner(key(name)) == port:
            return name


def _answers(cluster: RedisClusterServers, event_type: str) -> Counter[str]:
    """How many results each request id has, and which were not completed (``!status``)."""
    client = cluster.client()
    counts: Counter[str] = Counter()
    for topic in (completed_topic(event_type), failed_topic(event_type)):
        for _, fields in client.xrange(cluster_key(topic)):
            envelope = fields[b"envelope"].decode()
            request_id = envelope.split('"requestId":"', 1)[1].split('"', 1)[0]
            counts[request_id] += 1
            if topic == failed_topic(event_type) or '"debateStatus":"completed"' not in envelope:
                counts[f"!{request_id}"] += 1
    client.close()
    return counts


def _pending(cluster: RedisClusterServers, event_type: str) -> int:
    client = cluster.client()
    try:
        return int(client.xpending(cluster_key(event_type), GROUP)["pending"])
    finally:
        client.close()


async def _through_a_failover(cluster: RedisClusterServers, client: BusClient, settled: Settled,
                              calls: Counter[tuple[str, ...]], event_type: str, phase: str,
                              victim: int) -> tuple[Cost, int]:
    """Publish the phase's requests, kill ``victim`` once ``KILL_AFTER`` are answered, wait for
    every answer: what it cost, and the promoted master."""
    ids = [f"{phase}-{n}" for n in range(REQUESTS)]
    calls_before = sum(calls.values())
    await asyncio.gather(*(client.publish(event_type, {"input": f"{phase} question {n}"},
                                          request_id=request_id)
                           for n, request_id in enumerate(ids)))
    await settled.wait(ids, KILL_AFTER, 60.0)
    await asyncio.to_thread(cluster.kill, victim)
    killed = time.monotonic()
    promoted = await asyncio.to_thread(cluster.wait_failover, cluster_key(event_type), victim)
    promoted_at = time.monotonic()
    await settled.wait(ids, REQUESTS, ANSWERED_WITHIN_S)
    async with asyncio.timeout(10):  # settled: acknowledged too, so nothing stays pending
        while (pending := await asyncio.to_thread(_pending, cluster, event_type)):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    answers = await asyncio.to_thread(_answers, cluster, event_type)
    mine = {key: n for key, n in calls.items() if key[0].startswith(f"{phase} question ")}
    assert len({key[0] for key in mine}) == REQUESTS, "every debate of the phase made calls"
    after = [t for t in settled.times if t > killed]
    cost = Cost(
        answered_once=sum(answers[i] == 1 for i in ids),
        answered_twice=sum(answers[i] > 1 for i in ids),
        lost=sum(answers[i] == 0 for i in ids),
        pending=pending,
        not_completed=sum(answers[f"!{i}"] > 0 for i in ids),
        calls_paid_twice=sum(n - 1 for n in mine.values()),
        kill_to_promotion_s=round(promoted_at - killed, 2),
        kill_to_first_answer_s=round(min(after) - killed, 2),
        kill_to_last_answer_s=round(max(settled.at[i] for i in ids) - killed, 2))
    print(f"\n{phase}: {REQUESTS} requests, {sum(calls.values()) - calls_before} model calls, "
          f"master {victim} killed after {KILL_AFTER} answers, {promoted} promoted: {cost}")
    return cost, promoted


async def test_a_master_killed_mid_flow_costs_seconds_not_requests(
        cluster: RedisClusterServers, caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.get_running_loop()
    unhandled: list[str] = []

    def record(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        unhandled.append(str(context.get("message")))
        loop.default_exception_handler(context)

    loop.set_exception_handler(record)
    url = cluster.seeds_url
    event_type = f"debate:fo{uuid.uuid4().hex[:8]}"
    victim = cluster.owner(cluster_key(event_type))
    limit_name = _named_on(cluster, victim, lambda n: f"debatebus:{{ratelimit:fleet{n}}}:bucket")
    calls: Counter[tuple[str, ...]] = Counter()

    async def answer(request: LLMRequest) -> Any:
        question = request.prompt.split("\n", 1)[0].removeprefix("Debate topic: ")
        calls[(question, request.purpose, str(request.round), request.speaker)] += 1
        await asyncio.sleep(CALL_S)
        if request.purpose == "judge":
            return {"consensus": request.round >= 2, "summary": f"after round {request.round}"}
        return f"{request.speaker} on round {request.round}"

    limiter = RedisRateLimiter(url, f"fleet{limit_name}", RateLimit(
        requests_per_minute=100_000, max_concurrent=64), lease_s=10.0, connect_timeout=1.0,
        timeout_s=2.0)
    store = RedisCheckpointStore(url, prefix=f"fo-{uuid.uuid4().hex[:8]}", connect_timeout=1.0,
                                 timeout_s=2.0)
    settled = Settled()
    app = DebateBus(url, group=GROUP, concurrency=16, heartbeat_interval_s=None,
                    drain_timeout=10.0, observers=[settled], transport_options=OPTIONS)
    app.subscribe(event_type, make_debate(RateLimitedLLM(FunctionLLM(answer), limiter))
                  .as_handler(store=store, lease_ttl_s=10.0))
    try:
        async with running(app), BusClient(url, **OPTIONS) as client:
            first, promoted = await _through_a_failover(cluster, client, settled, calls,
                                                        event_type, "killed", victim)
            await asyncio.to_thread(cluster.restart, victim)  # back, as promoted's replica
            second, back = await _through_a_failover(cluster, client, settled, calls,
                                                     event_type, "rejoined", promoted)
    finally:
        await limiter.close()
        await store.close()
    gc.collect()  # a future with an unretrieved exception says so when it is collected
    loop.set_exception_handler(None)
    assert back == victim, "the restarted master took its slots back"
    for cost in (first, second):
        assert (cost.answered_once, cost.answered_twice, cost.lost, cost.pending,
                cost.not_completed) == (REQUESTS, 0, 0, 0, 0), cost
    assert [m for m in unhandled if "never retrieved" in m] == [], unhandled
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
