"""Durable debates through the handler: resume, replay, rerun, leases, drift, budgets, growth."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.support.durable import CountingLLM, Crash, debate, needed_calls

from debatebus import Budget
from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.checkpoints._base import CheckpointStore
from debatebus.exceptions import LeaseLostError
from debatebus.handlers._checkpointing import debate_key
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM


async def test_resume_continues_after_last_committed_round_without_repeating_calls() -> None:
    store = MemoryCheckpointStore()
    first = CountingLLM(crash_at=6)  # framing, r1: a b judge, r2: a, then crash on r2's b
    with pytest.raises(Crash):
        await debate(first).as_handler(store=store)({"input": "t"}, request_id="d1")
    second = CountingLLM()
    result = await debate(second).as_handler(store=store)({"input": "t"}, request_id="d1")
    assert result["debateStatus"] == "completed"
    assert [r["number"] for r in result["debateTranscript"]] == [1, 2, 3]
    # round 1 and the framing were committed: never asked again; round 2 re-runs from its top
    assert ("framing", 0, "mod") not in second.calls
    assert all(rnd != 1 for _, rnd, _ in second.calls)
    assert len(first.calls) + len(second.calls) == needed_calls(3) + 1  # + the lost call of r2


class DoublingStore(MemoryCheckpointStore):
    """Stores every append twice: what a client retrying an append whose reply was lost does."""

    async def append_many(self, debate_id: str, entries: list[bytes], counters: Any) -> int:
        await super().append_many(debate_id, entries, counters)
        return await super().append_many(debate_id, entries, counters)


async def test_resume_skips_rounds_that_were_stored_twice() -> None:
    store = DoublingStore()
    first = CountingLLM(crash_at=9)  # framing, r1 (3 calls), r2 (3 calls), r3: a, then crash
    with pytest.raises(Crash):
        await debate(first).as_handler(store=store)({"input": "t"}, request_id="twice")
    stored = await store.load(debate_key("durable", "twice"))
    assert stored is not None and len(stored.entries) == 6  # framing, r1, r2: each twice
    second = CountingLLM()
    result = await debate(second).as_handler(store=store)({"input": "t"}, request_id="twice")
    assert [r["number"] for r in result["debateTranscript"]] == [1, 2, 3]
    assert all(rnd == 3 or purpose == "synthesis" for purpose, rnd, _ in second.calls)
    assert len(second.calls) == 3 + 1  # round 3 and the synthesis, nothing committed again


async def test_finished_debate_is_replayed_with_zero_llm_calls() -> None:
    store = MemoryCheckpointStore()
    llm = CountingLLM()
    handler = debate(llm).as_handler(store=store)
    original = await handler({"input": "t"}, request_id="d2")
    calls = len(llm.calls)
    again = await handler({"input": "t"}, request_id="d2")
    assert len(llm.calls) == calls
    assert again["debateReplayed"] is True
    assert original["debateReplayed"] is False
    assert again["debateOutput"] == original["debateOutput"]
    assert again["debateTokenUsage"] == original["debateTokenUsage"]


async def test_rerun_runs_afresh_under_a_new_debate_id() -> None:
    store = MemoryCheckpointStore()
    llm = CountingLLM()
    handler = debate(llm).as_handler(store=store)
    original = await handler({"input": "t"}, request_id="d3")
    rerun = await handler({"input": "t", "replay": "rerun"}, request_id="d3")
    assert rerun["debateReplayed"] is False
    assert rerun["debateId"] != original["debateId"]
    assert rerun["debateId"].startswith("d3~rerun-")
    assert len(llm.calls) == 2 * needed_calls(3)


async def test_live_lease_blocks_a_second_run_and_expired_one_allows_resume() -> None:
    store = MemoryCheckpointStore()
    # Live 1 s past the check below, so a stalled machine cannot see it lapse before then.
    assert await store.acquire_lease(debate_key("durable", "d4"), "other-worker", 1.3)
    llm = CountingLLM()
    task = asyncio.create_task(debate(llm).as_handler(store=store, lease_ttl_s=5)(
        {"input": "t"}, request_id="d4"))
    await asyncio.sleep(0.3)
    assert not task.done() and llm.calls == [], "a live lease must block the second run"
    result = await asyncio.wait_for(task, 10)  # the other worker's lease expires: we take over
    assert result["debateStatus"] == "completed"
    assert len(llm.calls) == needed_calls(3)


async def test_losing_the_lease_stops_the_run_without_a_result() -> None:
    store = MemoryCheckpointStore()

    async def slow(request: LLMRequest) -> Any:
        await asyncio.sleep(0.05)
        return {"consensus": False, "summary": "s"} if request.purpose == "judge" else "x"

    # Renewed every 0.5 s: a stall of a second between renewals does not lose the lease; the
    # debate (20 rounds of 0.05 s calls) outlasts the renewal that finds it taken.
    handler = debate(FunctionLLM(slow), rounds=20).as_handler(store=store, lease_ttl_s=1.5)
    task = asyncio.create_task(handler({"input": "t"}, request_id="d5"))
    await asyncio.sleep(0.2)
    lease = await store.get_lease(debate_key("durable", "d5"))
    assert lease is not None
    await store.release_lease(debate_key("durable", "d5"), lease.owner)  # another worker takes it over
    assert await store.acquire_lease(debate_key("durable", "d5"), "thief", 30)
    with pytest.raises(LeaseLostError):
        await asyncio.wait_for(task, 10)
    assert await store.get_result(debate_key("durable", "d5")) is None


async def test_drift_strict_refuses_and_loose_resumes_by_round_number() -> None:
    store = MemoryCheckpointStore()
    with pytest.raises(Crash):
        await debate(CountingLLM(crash_at=6)).as_handler(store=store)({"input": "t"}, request_id="d6")
    changed = debate(CountingLLM(), system="For, but louder.")
    strict = await changed.as_handler(store=store)({"input": "t"}, request_id="d6")
    assert strict["debateStatus"] == "failed"
    assert "'durable' changed since debate 'd6' was checkpointed" in strict["debateError"]
    assert "drift='loose'" in strict["debateError"]
    llm = CountingLLM()
    loose = await debate(llm, system="For, but louder.").as_handler(store=store, drift="loose")(
        {"input": "t"}, request_id="d6")
    assert loose["debateStatus"] == "completed"
    assert all(rnd >= 2 for _, rnd, _ in llm.calls if _ != "synthesis")


async def test_budget_counts_calls_across_resumes() -> None:
    store = MemoryCheckpointStore()
    with pytest.raises(Crash):  # framing + round 1 committed (4 calls); round 2 lost mid-way
        await debate(CountingLLM(crash_at=6), budget=Budget(max_calls=7)).as_handler(store=store)(
            {"input": "t"}, request_id="d7")
    llm = CountingLLM()
    result = await debate(llm, budget=Budget(max_calls=7)).as_handler(store=store)(
        {"input": "t"}, request_id="d7")
    assert result["debateStatus"] == "failed"
    assert "budget max_calls=7" in result["debateError"]
    assert len(llm.calls) == 3  # committed 4 calls + 3 more = 7
    assert [r["number"] for r in result["debateTranscript"]] == [1, 2]  # round 3 hit the budget


async def _checkpoint_size(store: CheckpointStore, rounds: int) -> int:
    llm = CountingLLM(crash_on="synthesis")
    with pytest.raises(Crash):
        await debate(llm, rounds=rounds).as_handler(store=store)({"input": "t"},
                                                                request_id=f"size-{rounds}")
    return await store.size_bytes(debate_key("durable", f"size-{rounds}"))


async def test_checkpoint_bytes_grow_linearly_with_rounds() -> None:
    store = MemoryCheckpointStore()
    sizes = {n: await _checkpoint_size(store, n) for n in (2, 4, 8, 16)}
    per_round = [(sizes[b] - sizes[a]) / (b - a) for a, b in ((2, 4), (4, 8), (8, 16))]
    assert min(per_round) > 0
    assert max(per_round) / min(per_round) < 1.2, (sizes, per_round)
