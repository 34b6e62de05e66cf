"""Debates ending together store their results a few at a time: a wave of endings holds at most
``FINISHING`` result documents per runner, and every debate is still answered."""

from __future__ import annotations

import asyncio

import pytest
from tests.durable.test_group_commit import debate, llm

from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.handlers import durable


class HeldFinishes(MemoryCheckpointStore):
    """Holds every ``finish`` until ``gate`` opens, counting those waiting at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = 0
        self.most = 0
        self.full = asyncio.Event()  # set once 3 wait at once

    async def finish(self, debate_id: str, owner: str, result: bytes, *,
                     retention_s: float | None = None) -> None:
        self.waiting += 1
        self.most = max(self.most, self.waiting)
        if self.waiting >= 3:
            self.full.set()
        await self.gate.wait()
        self.waiting -= 1
        await super().finish(debate_id, owner, result, retention_s=retention_s)


async def test_a_wave_of_endings_stores_a_few_results_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(durable, "FINISHING", 3)
    store, calls = HeldFinishes(), []
    handler = debate(llm(calls, wait=True), rounds=1).as_handler(store=store)
    runs = [asyncio.create_task(handler({"input": "q"}, request_id=f"r{n}")) for n in range(10)]
    await asyncio.wait_for(store.full.wait(), 10)
    await asyncio.sleep(0.05)  # every debate has ended by now: the other 7 wait their turn
    assert (store.waiting, store.most) == (3, 3)
    store.gate.set()
    results = await asyncio.gather(*runs)
    assert [r["debateStatus"] for r in results] == ["completed"] * 10
    assert store.most == 3
    for n in range(10):
        assert await store.get_result(f"r{n}") is not None
