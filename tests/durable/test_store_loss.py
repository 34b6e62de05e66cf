"""A store that loses its data under a running debate (a Redis restarted without persistence):
the run takes its lapsed lease back, writes its checkpoint again from its own progress, and
finishes; nothing it paid for is thrown away."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from debatebus import Debate, Judge, Participant
from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.handlers._checkpointing import debate_key
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM

NAME = "lossy"


class Gated:
    """A model whose calls in ``gated_round`` wait for ``go``; it counts every call."""

    def __init__(self, gated_round: int) -> None:
        self.gated_round = gated_round
        self.go = asyncio.Event()
        self.waiting = asyncio.Event()
        self.calls = 0

    async def __call__(self, request: LLMRequest) -> Any:
        self.calls += 1
        if request.round == self.gated_round:
            self.waiting.set()
            await self.go.wait()
        if request.purpose == "judge":
            return {"consensus": False, "summary": f"round {request.round} split"}
        return f"{request.speaker} on round {request.round}"


def wipe(store: MemoryCheckpointStore) -> None:
    """Everything the store held, gone at once, as after a restart without persistence."""
    MemoryCheckpointStore.__init__(store)


async def test_a_debate_survives_its_store_losing_everything(caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    caplog.set_level(logging.WARNING, logger="debatebus.durable")
    store = MemoryCheckpointStore()
    model = Gated(gated_round=2)
    debate = Debate(NAME, [Participant("a", "For."), Participant("b", "Against.")],
                    llm=FunctionLLM(model), moderator=Participant("mod", "Moderate."),
                    judge=Judge(), max_rounds=3)
    handler = debate.as_handler(store=store, lease_ttl_s=0.3)
    key = debate_key(NAME, "r1")
    run = asyncio.create_task(handler({"input": "q"}, request_id="r1"))
    await asyncio.wait_for(model.waiting.wait(), 10)  # round 1 committed, round 2 under way
    before = await store.load(key)
    assert before is not None and len(before.entries) == 2  # the framing and round 1
    wipe(store)
    await asyncio.sleep(0.3)  # a renewal finds the lease gone (every ttl/3 = 0.1 s)
    model.go.set()
    result = await asyncio.wait_for(run, 10)
    assert result["debateStatus"] == "completed", result["debateError"]
    assert [r["number"] for r in result["debateTranscript"]] == [1, 2, 3]
    assert model.calls == 1 + 3 * 3 + 1  # nothing paid twice
    assert await store.get_result(key) is not None  # stored again, so a replay is free
    said = [r.getMessage() for r in caplog.records]
    assert any("had lapsed with nobody holding it" in line for line in said)


class StopsInRound3(Gated):
    """Gated in round 2; in round 3 it says so and never answers (the worker dies there), until
    ``dying`` is cleared."""

    def __init__(self) -> None:
        super().__init__(gated_round=2)
        self.in_round_3 = asyncio.Event()
        self.dying = True

    async def __call__(self, request: LLMRequest) -> Any:
        if request.round == 3 and self.dying:
            self.in_round_3.set()
            await asyncio.Event().wait()
        return await super().__call__(request)


async def test_the_checkpoint_is_written_again_whole_from_the_runs_progress() -> None:
    store = MemoryCheckpointStore()
    model = StopsInRound3()
    debate = Debate(NAME, [Participant("a", "For."), Participant("b", "Against.")],
                    llm=FunctionLLM(model), moderator=Participant("mod", "Moderate."),
                    judge=Judge(), max_rounds=3)
    key = debate_key(NAME, "r2")
    run = asyncio.create_task(debate.as_handler(store=store)({"input": "q"}, request_id="r2"))
    await asyncio.wait_for(model.waiting.wait(), 10)  # the framing and round 1 committed
    lost = await store.load(key)
    wipe(store)
    model.go.set()  # round 2 ends, and its commit finds no checkpoint to append to
    await asyncio.wait_for(model.in_round_3.wait(), 10)
    await asyncio.sleep(0.05)  # round 2's commit is written while round 3 waits on its model
    rewritten = await store.load(key)
    run.cancel()  # the worker dies in round 3
    with pytest.raises(asyncio.CancelledError):
        await run
    assert lost is not None and rewritten is not None
    assert rewritten.entries[:2] == lost.entries  # the framing and round 1, written again
    assert len(rewritten.entries) == 3  # and round 2
    model.dying = False
    resumed = await debate.as_handler(store=store, lease_ttl_s=0.3)({"input": "q"},
                                                                    request_id="r2")
    assert resumed["debateResumedFromRound"] == 2
