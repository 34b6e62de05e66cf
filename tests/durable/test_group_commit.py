"""Group commit: a durable debate's commits are written behind it, once it waits on a model call;
a commit made while a write is on the wire waits for it; the result supersedes what was not sent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.support.group_commit import debate, llm

from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.checkpoints._base import Counters
from debatebus.exceptions import TransportError
from debatebus.handlers._checkpointing import debate_key
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM


class RecordingStore(MemoryCheckpointStore):
    """Records each append's entry count; ``gate`` (when set) holds every append until opened;
    ``fail`` makes appends raise."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[int] = []
        self.gate: asyncio.Event | None = None
        self.fail = False

    async def append_many(self, debate_id: str, entries: list[bytes], counters: Counters, *,
                          retention_s: float | None = None) -> int:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise TransportError("store down")
        self.appends.append(len(entries))
        return await super().append_many(debate_id, entries, counters, retention_s=retention_s)


async def test_a_debate_that_waits_writes_each_step_as_it_goes() -> None:
    store, calls = RecordingStore(), []
    result = await debate(llm(calls, wait=True)).as_handler(store=store)({"input": "q"},
                                                                          request_id="r1")
    assert result["debateStatus"] == "completed"
    # framing, then rounds 1..3, each written while the debate waited on its next call
    assert store.appends == [1, 1, 1, 1]
    assert await store.get_result(debate_key("gc", "r1")) is not None


async def test_a_debate_that_never_waits_writes_only_its_result() -> None:
    store, calls = RecordingStore(), []
    result = await debate(llm(calls, wait=False)).as_handler(store=store)({"input": "q"},
                                                                           request_id="r1")
    assert result["debateStatus"] == "completed"
    assert store.appends == []  # superseded by the result, which finish stored
    assert await store.get_result(debate_key("gc", "r1")) is not None
    # and the checkpoint is gone, as after every finish
    assert await store.load(debate_key("gc", "r1")) is None


async def test_a_commit_waits_for_the_write_on_the_wire() -> None:
    """With the framing's write held, the debate runs round 1 and then waits at its commit: it
    never runs further ahead of its checkpoint than one step."""
    store, calls = RecordingStore(), []
    store.gate = asyncio.Event()
    run = asyncio.create_task(debate(llm(calls, wait=True)).as_handler(store=store)(
        {"input": "q"}, request_id="r1"))
    for _ in range(200):
        await asyncio.sleep(0.002)
    assert calls == ["framing:0:mod", "opening:1:a", "opening:1:b", "judge:1:judge"]
    store.gate.set()
    result = await run
    assert result["debateStatus"] == "completed"
    assert store.appends[:2] == [1, 1]  # the framing, then round 1: in order, nothing lost
    assert len(result["debateTranscript"]) == 3


async def test_a_failed_write_fails_the_run_at_its_next_commit() -> None:
    store, calls = RecordingStore(), []
    store.fail = True
    handler = debate(llm(calls, wait=True)).as_handler(store=store, store_outage_s=0.05)
    with pytest.raises(TransportError, match="store down"):
        await handler({"input": "q"}, request_id="r1")
    # the framing's write failed (after store_outage_s) while round 1 ran: round 1's commit
    # raised it, and no later round was paid for
    assert not any(c.endswith(":2:a") for c in calls)
    assert await store.get_result(debate_key("gc", "r1")) is None


async def test_a_run_that_crashes_keeps_what_it_committed() -> None:
    """A step committed just before a crash, with no wait in between, is still written: the
    delivery that resumes the debate does not pay for it again."""
    store, calls = RecordingStore(), []

    class Crash(BaseException):
        pass

    def answer(request: LLMRequest) -> Any:
        if request.purpose == "rebuttal":
            raise Crash
        calls.append(request.purpose)
        return {"consensus": False, "summary": "go on"} if request.purpose == "judge" else "x"

    with pytest.raises(Crash):
        await debate(FunctionLLM(answer, model="fn")).as_handler(store=store)(
            {"input": "q"}, request_id="r1")
    checkpoint = await store.load(debate_key("gc", "r1"))
    assert checkpoint is not None and len(checkpoint.entries) == 2  # framing and round 1
    assert checkpoint.counters.calls == 4
