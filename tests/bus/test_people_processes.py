"""A person in a debate across worker processes on Redis Streams: the worker that asked for her
turn is SIGKILLed while she types, her reply is published by another process while no worker
listens, and the worker that resumes the debate takes that reply: used once, the debate finishes,
and no model call is made twice."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.processes import WorkerProcess, collecting, read_calls

from debatebus.handlers._people import turn_reply
from debatebus.schemas.envelope import ENVELOPE_DECODER

pytestmark = pytest.mark.slow

SHE_SAYS = "alice: ship it behind a flag"

@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.stop()

async def test_a_reply_sent_after_the_asking_worker_died_is_taken_by_the_one_that_resumes(
        redis_server: Any, workers: list[WorkerProcess], tmp_path: Path) -> None:
    url, tag = redis_server.url, uuid.uuid4().hex[:8]
    debate_type, alice_type = f"debate:people:{tag}", f"debate:turn:alice:{tag}"
    env = {"DBB_BROKER": url, "DBB_STORE": url, "DBB_LEASE_TTL": "2", "DBB_CLAIM_IDLE_MS": "1500",
           "DBB_CALLS_LOG": str(tmp_path / "calls.log"), "DBB_EVENT_TYPE": debate_type,
           "DBB_GROUP": f"g-{tag}", "DBB_ROUNDS": "1", "DBB_PERSON": f"alice={alice_type}"}
    async with collecting(url, debate_type) as (client, collector):
        requests = await client.transport.subscribe([alice_type])
        first = WorkerProcess(env, tmp_path / "first.log")
        workers.append(first)
        await client.publish(debate_type, {"input": "ship it?"}, request_id="d1")
        async with asyncio.timeout(60):
            request = ENVELOPE_DECODER.decode((await anext(requests)).body)
        first.kill()  # while she types
        assert request.message_id is not None
        # Her reply, from this process, while no worker runs.
        await client.transport.publish(turn_reply(alice_type, request.request_id,
                                                  request.message_id, SHE_SAYS))
        second = WorkerProcess(env, tmp_path / "second.log")
        workers.append(second)
        await collector.wait_for(["d1"], 60)
        sent = [ENVELOPE_DECODER.decode(d.body) async for d in client.transport.read_range(alice_type)]

    (result,) = collector.results
    assert result.payload["debateStatus"] == "completed", second.problems()
    (rnd,) = result.payload["debateTranscript"]
    assert [(t["speaker"], t["text"]) for t in rnd["turns"]] == [
        ("optimist", "optimist in round 1"), ("alice", SHE_SAYS), ("critic", "critic in round 1")]
    assert [e.request_id for e in sent] == [request.request_id]  # asked once
    calls = Counter((c["purpose"], c["round"], c["speaker"]) for c in read_calls(
        tmp_path / "calls.log"))
    assert set(calls.values()) == {1}, calls  # no model call made twice...
    assert calls[("opening", 1, "optimist")] == 1  # ...not even the one before her turn
    pids = {c["pid"] for c in read_calls(tmp_path / "calls.log") if c["speaker"] == "critic"}
    assert pids == {second.pid}  # the debate went on in the worker that resumed it
