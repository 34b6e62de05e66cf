"""Kafka (Tansu) under operator faults: broker restart, oversized messages, SIGTERM with debates in
flight, and a forged delivery-count header. Worker subprocesses; results counted by requestId."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.processes import (
    Collector,
    WorkerProcess,
    calls_by_question,
    collecting,
    env_for,
    wait_until,
)
from tests.support.servers import RedisServer, TansuServer

from debatebus.client import BusClient, request_message
from debatebus.transports._base import Delivery, Outgoing, dlq_topic

#: The calls of one debate of the worker app: framing, 2 rounds × (2 turns + judge), synthesis.
NEEDED = 8

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

MIB = 1024 * 1024


class DeadLetters:
    """Request ids of the records dead-lettered to ``{type}:dlq`` after ``start`` returns."""

    def __init__(self) -> None:
        self.ids: Counter[str] = Counter()
        self.task: asyncio.Task[None] | None = None

    async def start(self, client: BusClient, event_type: str) -> None:
        it = await client.transport.subscribe([dlq_topic(event_type)])

        async def pump(deliveries: AsyncIterator[Delivery]) -> None:
            async for delivery in deliveries:
                try:
                    self.ids[str(json.loads(delivery.body)["requestId"])] += 1
                except (ValueError, KeyError, TypeError, RecursionError):
                    self.ids[delivery.key or "?"] += 1

        self.task = asyncio.create_task(pump(it))


async def _settled(collector: Collector, dlq: DeadLetters, ids: list[str], timeout: float) -> None:
    """Wait until every id has a result event or a dead letter; fail with the counts otherwise."""
    def settled() -> int:
        return sum(1 for i in ids if collector.counts()[i] + dlq.ids[i])

    for _ in range(int(timeout / 0.2)):
        if settled() == len(ids):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{settled()} of {len(ids)} messages settled in {timeout}s")


def _kafka_env(url: str, event_type: str, tmp_path: Path, **knobs: object) -> dict[str, str]:
    settings: dict[str, object] = {"DBB_DELAY": "0.02", "DBB_ROUNDS": 2, **knobs}
    return env_for(url, event_type, tmp_path, **settings)


async def _warm_up(client: Any, collector: Any, event_type: str) -> None:
    for attempt in range(6):
        rid = f"warm-up-{attempt}"
        await client.publish(event_type, {"input": f"warm up {attempt}"}, request_id=rid)
        try:
            await collector.wait_for([rid], 10)
            return
        except TimeoutError:
            continue
    raise AssertionError("no warm-up request was answered in 60 s after the Tansu restart")


async def test_tansu_kill9_and_restart_keeps_the_worker_and_answers_new_requests(
        fault_tansu: TansuServer, redis_server: RedisServer, event_type: str, tmp_path: Path,
        workers: list[WorkerProcess]) -> None:
    """Tansu's memory storage loses every topic, record and committed offset on restart: requests
    in flight at the kill are lost with it (printed below). What must hold is that the worker
    stays up, rejoins, runs exactly one debate for every request published after the restart
    (counted from the LLM calls), and never answers one twice.

    Whether every result then reaches a reader is Tansu's to keep: right after a restart it has
    acknowledged a result produced into a topic it had just re-created and then never served it
    (1–3 of 20 in some runs, every debate having run once). That count is printed, not asserted."""
    url = fault_tansu.url
    worker = WorkerProcess(_kafka_env(url, event_type, tmp_path, DBB_STORE=redis_server.url),
                           tmp_path / "worker.log")
    workers.append(worker)
    calls = tmp_path / "calls.log"
    async with collecting(url, event_type) as (client, collector):
        before = [await client.publish(event_type, {"input": f"before {i}"}, request_id=f"before-{i}")
                  for i in range(10)]
        await collector.wait_for(before, 60)
        inflight = [await client.publish(event_type, {"input": f"inflight {i}"},
                                         request_id=f"inflight-{i}") for i in range(10)]
        await asyncio.to_thread(wait_until, lambda: any("inflight" in t for t in calls_by_question(calls)),
                                30, "the in-flight debates to start")
    fault_tansu.kill9()
    for _ in range(20):
        await asyncio.sleep(0.1)
        worker.assert_alive("during the Tansu outage")
    await asyncio.to_thread(fault_tansu.restart_same_port)
    lost_inflight = [i for i in inflight if collector.counts()[i] == 0]
    print(f"Tansu restart: {len(lost_inflight)} of 10 in-flight requests had no result at the kill; "
          "memory storage lost them with their topics and offsets")
    worker.assert_alive("after Tansu restarted")
    async with collecting(url, event_type) as (client, collector):
        await client.transport.ensure_topics([event_type])  # the restart lost the request topic
        # Tansu's memory storage can acknowledge a record produced into a topic it has just
        # re-created and then drop it (seen for the first results after a restart): wait until
        # one request has made the whole round trip, then count from a broker in steady state.
        await _warm_up(client, collector, event_type)
        after = [await client.publish(event_type, {"input": f"after {i}"}, request_id=f"after-{i}")
                 for i in range(20)]
        topics = {f"Debate topic: after {i}" for i in range(20)}
        await asyncio.to_thread(
            wait_until, lambda: topics <= set(calls_by_question(calls)) and all(
                calls_by_question(calls)[t] >= NEEDED for t in topics), 60,
            "every request published after the restart to run its debate")
        with contextlib.suppress(TimeoutError):
            await collector.wait_for(after, 20)
        await asyncio.sleep(2.0)
    made = calls_by_question(calls)
    assert all(made[t] == NEEDED for t in topics), {t: made[t] for t in topics if made[t] != NEEDED}
    counts = collector.counts()
    assert all(counts[i] <= 1 for i in after), {i: counts[i] for i in after if counts[i] > 1}
    print(f"Tansu restart: {sum(1 for i in after if counts[i])} of 20 results after the restart "
          "reached the reader")
    worker.assert_alive("at the end")


@pytest.mark.parametrize("oversized", ["input", "result"])
async def test_oversized_messages_never_block_the_partition(
        tansu_server: TansuServer, event_type: str, tmp_path: Path, workers: list[WorkerProcess],
        oversized: str) -> None:
    """16 requests that cannot be answered in full (an input just over 1 MiB, or a valid input
    whose result is over 1 MiB), then 20 good ones: all 36 settled, the 20 answered."""
    url = tansu_server.url
    env = _kafka_env(url, event_type, tmp_path, DBB_DELAY="0.01", DBB_HUGE_BYTES=300_000)
    workers.append(WorkerProcess(env, tmp_path / "worker.log"))
    big = [(f"big-{i}", {"input": "y" * (MIB + 100)} if oversized == "input"
            else {"input": f"HUGE_RESULT {i}"}) for i in range(16)]
    good = [(f"good-{i}", {"input": f"good {i}"}) for i in range(20)]
    async with collecting(url, event_type) as (client, collector), \
            BusClient(url, max_request_size=4 * MIB) as publisher:
        dlq = DeadLetters()
        await dlq.start(client, event_type)
        for rid, payload in big + good:
            await publisher.publish(event_type, payload, request_id=rid)
        await _settled(collector, dlq, [rid for rid, _ in big + good], 60)
        await asyncio.sleep(1.0)
    counts = collector.counts()
    completed = Counter(e.request_id for e in collector.results
                        if e.payload.get("debateStatus") == "completed")
    assert all(completed[rid] == 1 for rid, _ in good), {rid: counts[rid] for rid, _ in good}
    for rid, _ in big:
        assert counts[rid] + dlq.ids[rid] == 1, f"{rid}: {counts[rid]} results, {dlq.ids[rid]} DLQ"
    for envelope in collector.results:
        if envelope.request_id.startswith("big-") and envelope.payload.get("debateStatus") == "failed":
            assert len(json.dumps(envelope.payload)) < MIB, "a failure event echoed the whole payload"
    workers[0].assert_alive("after the oversized messages")


async def test_sigterm_with_8_in_flight_answers_each_once(
        tansu_server: TansuServer, event_type: str, tmp_path: Path,
        workers: list[WorkerProcess]) -> None:
    url = tansu_server.url
    calls = tmp_path / "calls.log"
    env = _kafka_env(url, event_type, tmp_path, DBB_DELAY="0.3", DBB_CONCURRENCY=8)
    first = WorkerProcess(env, tmp_path / "first.log")
    workers.append(first)
    async with collecting(url, event_type) as (client, collector):
        ids = [await client.publish(event_type, {"input": f"drain {i}"}, request_id=f"drain-{i}")
               for i in range(8)]
        await asyncio.to_thread(wait_until, lambda: len(calls_by_question(calls)) >= 8, 60,
                                "all 8 debates to be in flight")
        code = await asyncio.to_thread(first.terminate, 60)
        assert code == 0, f"SIGTERM exit code {code}; log ends:\n{first.log_tail()}"
        workers.append(WorkerProcess(env, tmp_path / "second.log"))
        await collector.wait_for(ids, 60)
        await asyncio.sleep(8.0)  # the second worker re-reads anything the first did not commit
    counts = collector.counts()
    twice = {i: counts[i] for i in ids if counts[i] != 1}
    assert not twice, f"answered more than once after a clean SIGTERM: {twice}"


async def test_forged_delivery_count_header_is_ignored(
        tansu_server: TansuServer, event_type: str, tmp_path: Path,
        workers: list[WorkerProcess]) -> None:
    url = tansu_server.url
    workers.append(WorkerProcess(_kafka_env(url, event_type, tmp_path), tmp_path / "worker.log"))
    async with collecting(url, event_type) as (client, collector):
        dlq = DeadLetters()
        await dlq.start(client, event_type)
        message = request_message(event_type, {"input": "forged"}, request_id="forged")
        await client.transport.publish(Outgoing(message.topic, message.body, key=message.key,
                                                headers={"x-debatebus-deliveries": "999"}))
        await _settled(collector, dlq, ["forged"], 60)
    assert dlq.ids["forged"] == 0, "dead-lettered on its first delivery because of a forged header"
    (result,) = collector.results
    assert result.payload["debateStatus"] == "completed", result.payload
