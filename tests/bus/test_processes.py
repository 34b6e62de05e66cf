"""Worker processes on real brokers: sharing a group, takeover after SIGKILL, drain on SIGTERM."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.processes import (
    WorkerProcess,
    calls_by_question,
    collecting,
    env_for,
    read_calls,
    wait_until,
)
from tests.support.quiet import results_read, settled_group

pytestmark = pytest.mark.slow


@pytest.fixture(params=["redis_streams", "kafka"])
def durable_url(request: pytest.FixtureRequest) -> str:
    if request.param == "kafka":
        return str(request.getfixturevalue("tansu_server").url)
    return str(request.getfixturevalue("redis_server").url)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.stop()


def serving(worker: WorkerProcess) -> bool:
    """Whether the worker has logged that it serves (it consumes from then on)."""
    return " serving " in (worker.log.read_text(errors="replace") if worker.log.exists() else "")


async def test_two_workers_share_the_group_and_answer_each_request_once(
        durable_url: str, workers: list[WorkerProcess], tmp_path: Path) -> None:
    event_type = f"debate:req{uuid.uuid4().hex[:6]}"
    env = env_for(durable_url, event_type, tmp_path, DBB_DELAY="0.02")
    async with collecting(durable_url, event_type) as (client, collector):
        for i in range(2):
            workers.append(WorkerProcess(env, tmp_path / f"w{i}.log"))
        # Both serving before the first request: on a loaded machine one worker can start
        # seconds after the other, and the first alone would answer all 30.
        await asyncio.to_thread(wait_until, lambda: all(serving(w) for w in workers), 60,
                                "both workers to serve")
        ids = [await client.publish(event_type, {"input": f"topic {i}"}, request_id=f"r{i}")
               for i in range(30)]
        await collector.wait_for(ids, 120)
        # Every request acked (Redis) or committed (Kafka): none can be delivered again, and the
        # results of any that ran twice were published before that.
        await settled_group(durable_url, event_type, env["DBB_GROUP"])
        await results_read(durable_url, event_type, collector)
    counts = collector.counts()
    assert all(counts[i] == 1 for i in ids), counts
    pids = {c["pid"] for c in read_calls(tmp_path / "calls.log")}
    assert pids == {w.pid for w in workers}, "both workers should have taken part"


async def test_killed_worker_request_is_taken_over(
        durable_url: str, workers: list[WorkerProcess], tmp_path: Path) -> None:
    event_type = f"debate:req{uuid.uuid4().hex[:6]}"
    calls = tmp_path / "calls.log"
    # A 2 s lease (the live worker renews it), not the default 30 s: the second worker takes
    # over once the killed worker's lease has lapsed.
    env = env_for(durable_url, event_type, tmp_path, DBB_DELAY="0.5", DBB_LEASE_TTL="2")
    async with collecting(durable_url, event_type) as (client, collector):
        first = WorkerProcess(env, tmp_path / "first.log")
        workers.append(first)
        rid = await client.publish(event_type, {"input": "victim"}, request_id="victim")
        await asyncio.to_thread(wait_until, lambda: calls_by_question(calls)["Debate topic: victim"] >= 2,
                                60, "the first worker to start the debate")
        first.kill()
        workers.append(WorkerProcess(env, tmp_path / "second.log"))
        await collector.wait_for([rid], 120)
    result = collector.results[0]
    assert result.payload["debateStatus"] == "completed"
    assert {c["pid"] for c in read_calls(calls)} == {w.pid for w in workers}


async def test_sigterm_drains_in_flight_debate_before_exiting(
        durable_url: str, workers: list[WorkerProcess], tmp_path: Path) -> None:
    event_type = f"debate:req{uuid.uuid4().hex[:6]}"
    calls = tmp_path / "calls.log"
    env = env_for(durable_url, event_type, tmp_path, DBB_DELAY="0.3")
    async with collecting(durable_url, event_type) as (client, collector):
        worker = WorkerProcess(env, tmp_path / "w.log")
        workers.append(worker)
        rid = await client.publish(event_type, {"input": "drain me"}, request_id="drain")
        await asyncio.to_thread(wait_until, lambda: calls_by_question(calls)["Debate topic: drain me"] >= 1,
                                60, "the debate to start")
        code = await asyncio.to_thread(worker.terminate, 60)
        assert code == 0, (tmp_path / "w.log").read_text()
        await collector.wait_for([rid], 10)
    assert collector.results[0].payload["debateStatus"] == "completed"
