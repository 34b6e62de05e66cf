"""Chaos: worker processes SIGKILLed at random moments while 20 slow debates run.

Every request must end with exactly one final result event (on Kafka, which has no transactions:
at most one fresh one, and store replays of the same output, ``assert_store_answers``); no debate
pays for more than its needed calls plus, per kill of a worker running it, the round it
interrupted and the one before when that one's commit had not landed (group commit);
no transcript repeats a round; and replaying the whole request topic afterwards costs zero LLM
calls.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from tests.support.processes import (
    WorkerProcess,
    assert_store_answers,
    collecting,
    env_for,
    read_calls,
)
from tests.support.quiet import results_read, settled_group

from debatebus.client import BusClient

pytestmark = pytest.mark.slow

DEBATES = 20
ROUNDS = 3
NEEDED = 1 + ROUNDS * 3 + 1  # framing, per round 2 turns + judge, synthesis
ROUND_CALLS = 3
KILLS = 6


@pytest.fixture(params=["redis_streams", "kafka"])
def chaos_url(request: pytest.FixtureRequest) -> str:
    if request.param == "kafka":
        return str(request.getfixturevalue("tansu_server").url)
    return str(request.getfixturevalue("redis_server").url)


async def _chaos(workers: list[WorkerProcess], env: dict[str, str], tmp_path: Path,
                 rng: random.Random) -> dict[int, int]:
    """Kill a worker KILLS times at random moments, restarting it each time; returns kills per
    pid. The victim is one that made a model call lately, when there is one: killing the worker
    that holds nothing (on Kafka, the one without the partition) would test nothing."""
    killed: dict[int, int] = defaultdict(int)
    for n in range(KILLS):
        await asyncio.sleep(rng.uniform(0.8, 2.0))
        busy = await _busy(workers, tmp_path)
        victim = rng.choice(busy) if busy else rng.randrange(len(workers))
        killed[workers[victim].pid] += 1
        workers[victim].kill()
        workers[victim] = WorkerProcess(env, tmp_path / f"w{victim}-{n}.log")
    return killed


async def _busy(workers: list[WorkerProcess], tmp_path: Path) -> list[int]:
    """The workers that made one of the last model calls, waiting (up to 10 s) for a call made
    since this was asked: on a loaded machine a restarted worker (a Kafka one rejoining its
    group) may take seconds to run anything, and a kill before then interrupts nothing."""
    seen = len(read_calls(tmp_path / "calls.log"))
    for _ in range(100):  # the calls log, polled: nothing to await on across processes
        calls = read_calls(tmp_path / "calls.log")
        recent = {call["pid"] for call in calls[max(seen, len(calls) - 12):]}
        busy = [i for i, worker in enumerate(workers) if worker.pid in recent]
        if busy:
            return busy
        await asyncio.sleep(0.1)
    return []


async def test_chaos_kills_lose_nothing_and_repeat_nothing(chaos_url: str, redis_server: object,
                                                           tmp_path: Path) -> None:
    rng = random.Random(20261130)
    event_type = f"debate:chaos{uuid.uuid4().hex[:6]}"
    store = f"{redis_server.url}"  # type: ignore[attr-defined]
    # Each kill of a worker holding a request adds a delivery to it, whether the worker was running
    # it or had only read it ahead (Redis Streams counts every read): the KILLS kills could push a
    # request past the default poison threshold (5) and into the DLQ, which is not what this
    # test is about. Seen once on a loaded machine: requests 3-5 sat with killed workers 5 times.
    env = env_for(chaos_url, event_type, tmp_path, DBB_DELAY="0.15", DBB_ROUNDS=ROUNDS,
                  DBB_STORE=store, DBB_LEASE_TTL="1.5", DBB_CONCURRENCY="3",
                  DBB_CLAIM_IDLE_MS="1500", DBB_MAX_DELIVERIES=str(KILLS + 2))
    workers = [WorkerProcess(env, tmp_path / f"w{i}.log") for i in range(2)]
    try:
        async with collecting(chaos_url, event_type) as (client, collector):
            # Request ids unique to this run: the checkpoint store outlives a single test.
            ids = [await client.publish(event_type, {"input": f"chaos {i}"},
                                        request_id=f"{event_type}-{i}") for i in range(DEBATES)]
            killed = await _chaos(workers, env, tmp_path, rng)
            await collector.wait_for(ids, 240)
            # Every request acked (Redis) or committed (Kafka): none can be delivered again, and
            # a duplicate's result was published before that; then the collector has read them all.
            await settled_group(chaos_url, event_type, env["DBB_GROUP"], 120)
            await results_read(chaos_url, event_type, collector)
            counts = collector.counts()
            answered = list(collector.results)
            finals = {e.request_id: e for e in answered}
            calls_before_replay = len(read_calls(tmp_path / "calls.log"))
            await _replay_topic(client, chaos_url, event_type, ids)
            await collector.wait_for_count(ids, 2, 120)
    finally:
        for w in workers:
            w.stop()
    if chaos_url.startswith("kafka://"):
        assert_store_answers(answered, ids)
    else:
        assert all(counts[i] == 1 for i in ids), f"results per request: {counts}"
    for rid, envelope in finals.items():
        numbers = [r["number"] for r in envelope.payload["debateTranscript"]]
        assert numbers == list(range(1, ROUNDS + 1)), (rid, numbers)
        assert envelope.payload["debateStatus"] == "completed", envelope.payload["debateError"]
    calls = read_calls(tmp_path / "calls.log")
    per_debate: dict[str, list[dict[str, object]]] = defaultdict(list)
    for call in calls[:calls_before_replay]:
        per_debate[str(call["question"])].append(call)
    taken_over = 0
    for i in range(DEBATES):
        made = per_debate[f"Debate topic: chaos {i}"]
        pids = {c["pid"] for c in made}
        kills = sum(killed.get(int(str(pid)), 0) for pid in pids)
        # A kill repeats at most the step it interrupted and, when that step's model call came
        # before the previous step's commit had landed (group commit: docs/durability.md), that
        # uncommitted step too; never a committed one.
        assert NEEDED <= len(made) <= NEEDED + 2 * ROUND_CALLS * kills, (i, len(made), kills)
        taken_over += len(pids) > 1
    assert taken_over >= 1, "the kills should have interrupted at least one debate mid-way"
    assert len(calls) == calls_before_replay, "replaying finished requests must cost no LLM call"
    replays = [e for e in collector.results if e.payload.get("debateReplayed")]
    assert {e.request_id for e in replays} == set(ids)


async def _replay_topic(client: BusClient, url: str, event_type: str, ids: list[str]) -> None:
    """Ops replay of the whole request topic: every original request re-published as-is."""
    from debatebus.cli._ops_cmds import replay_range

    summary = await replay_range(client.transport, event_type, start=None, end=None)
    assert summary.republished >= len(ids)
