"""One debate per debate id: concurrent copies of a request, and ids reused with another input."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tests.support.faults import (
    CALLS_PER_DEBATE,
    publish_requests,
    stream_results,
    wait_answered,
)
from tests.support.processes import WorkerProcess, calls_by_question, collecting, env_for
from tests.support.servers import RedisServer, TansuServer

pytestmark = [pytest.mark.slow]


def _replayed(results: list[dict[str, Any]]) -> Counter[bool]:
    return Counter(bool(r.get("debateReplayed")) for r in results)


def _check_one_debate(calls: Path, topic: str, payloads: list[dict[str, Any]]) -> None:
    spent = calls_by_question(calls)[f"Debate topic: {topic}"]
    statuses = Counter(p.get("debateStatus") for p in payloads)
    assert spent == CALLS_PER_DEBATE, (
        f"5 concurrent copies cost {spent} LLM calls, not the {CALLS_PER_DEBATE} of one debate "
        f"(statuses {dict(statuses)}, replayed {dict(_replayed(payloads))})")
    assert statuses == {"completed": 5}, f"copies answered differently: {dict(statuses)}"
    assert _replayed(payloads) == {False: 1, True: 4}, dict(_replayed(payloads))


@pytest.mark.redis
async def test_same_request_id_five_times_at_once_on_redis_runs_one_debate(
        fault_redis: RedisServer, event_type: str, tmp_path: Path,
        workers: list[WorkerProcess]) -> None:
    env = env_for(fault_redis.url, event_type, tmp_path, DBB_DELAY="0.05", DBB_CONCURRENCY=8)
    workers.append(WorkerProcess(env, tmp_path / "worker.log"))
    await asyncio.to_thread(publish_requests, fault_redis, event_type, [("dup", {"input": "dup"})] * 5)
    results = await wait_answered(fault_redis, event_type, ["dup"], 30, workers[0])
    for _ in range(50):  # until all five copies are answered, or 10 s
        if len(results.of("dup")) >= 5:
            break
        await asyncio.sleep(0.2)
        results = await asyncio.to_thread(stream_results, fault_redis, event_type)
    await asyncio.sleep(1.0)
    results = await asyncio.to_thread(stream_results, fault_redis, event_type)
    assert len(results.of("dup")) == 5, f"{len(results.of('dup'))} result events for 5 copies"
    _check_one_debate(tmp_path / "calls.log", "dup", [e["payload"] for e in results.of("dup")])


@pytest.mark.kafka
async def test_same_request_id_five_times_at_once_on_kafka_runs_one_debate(
        tansu_server: TansuServer, redis_server: RedisServer, event_type: str, tmp_path: Path,
        workers: list[WorkerProcess]) -> None:
    url = tansu_server.url
    env = env_for(url, event_type, tmp_path, DBB_DELAY="0.05", DBB_CONCURRENCY=8,
                  DBB_STORE=redis_server.url)
    workers.append(WorkerProcess(env, tmp_path / "worker.log"))
    topic = f"kdup {event_type}"  # the session store is shared: a topic of this test's own
    async with collecting(url, event_type) as (client, collector):
        await asyncio.gather(*(client.publish(event_type, {"input": topic}, request_id=f"dup-{event_type}")
                               for _ in range(5)))
        await collector.wait_for_count([f"dup-{event_type}"], 5, 60)
        await asyncio.sleep(1.0)
    payloads = [e.payload for e in collector.results]
    assert len(payloads) == 5, f"{len(payloads)} result events for 5 copies"
    _check_one_debate(tmp_path / "calls.log", topic, payloads)


def _says_input_reused(payload: dict[str, Any]) -> str | None:
    """None when ``payload`` is a failure that says the id was reused with another input."""
    error = str(payload.get("debateError") or "")
    if payload.get("debateStatus") != "failed":
        return (f"status {payload.get('debateStatus')!r}, replayed={payload.get('debateReplayed')}, "
                f"output {str(payload.get('debateOutput'))[:60]!r}: the old debate's answer was served")
    lowered = error.lower()
    if "input" not in lowered or not ("reuse" in lowered or "differ" in lowered):
        return f"failed, but the error does not say the id was reused with another input: {error!r}"
    return None


@pytest.mark.redis
async def test_reused_request_or_debate_id_with_another_input_fails_saying_so(
        fault_redis: RedisServer, event_type: str, tmp_path: Path,
        workers: list[WorkerProcess]) -> None:
    env = env_for(fault_redis.url, event_type, tmp_path, DBB_DELAY="0.01")
    workers.append(WorkerProcess(env, tmp_path / "worker.log"))
    await asyncio.to_thread(publish_requests, fault_redis, event_type,
                            [("used", {"input": "the first question"})])
    await wait_answered(fault_redis, event_type, ["used"], 30, workers[0])
    await asyncio.to_thread(publish_requests, fault_redis, event_type, [
        ("used", {"input": "a different question"}),
        ("borrower", {"input": "a third question", "debateId": "used"}),
    ])
    results = await wait_answered(fault_redis, event_type, ["borrower"], 30, workers[0])
    for _ in range(50):
        if len(results.of("used")) >= 2:
            break
        await asyncio.sleep(0.2)
        results = await asyncio.to_thread(stream_results, fault_redis, event_type)
    assert len(results.of("used")) == 2, f"{len(results.of('used'))} results for 'used'"
    (second,) = [e for e in results.of("used") if e["payload"].get("input") != "the first question"]
    problems = {
        "same requestId, different input": _says_input_reused(second["payload"]),
        "new requestId naming another debateId": _says_input_reused(results.of("borrower")[0]["payload"]),
    }
    assert not any(problems.values()), {k: v for k, v in problems.items() if v}
