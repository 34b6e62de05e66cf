"""Debates ending together store their results a few at a time: a wave of endings holds at most
``FINISHING`` result documents per runner, and every debate is still answered."""

from __future__ import annotations

import asyncio

import pytest
from tests.support.group_commit import debate, llm

from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.handlers import _durable as durable
from debatebus.handlers._checkpointing import debate_key


class HeldFinishes(MemoryCheckpointStore):
    """Holds every ``finish`` until ``gate`` opens, counting those waiting at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = 0
        self.most = 0
        self._counts: dict[int, asyncio.Event] = {}

    async def finish(self, debate_id: str, owner: str, result: bytes, *,
                     retention_s: float | None = None) -> None:
        self.waiting += 1
        self.most = max(self.most, self.waiting)
        for count, event in self._counts.items():
            if self.waiting >= count:
                event.set()
        await self.gate.wait()
        self.waiting -= 1
        await super().finish(debate_id, owner, result, retention_s=retention_s)

    async def full_at(self, count: int) -> None:
        """Until ``count`` finishes wait at once."""
        if self.waiting < count:
            await self._counts.setdefault(count, asyncio.Event()).wait()


async def test_a_wave_of_endings_stores_a_few_results_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(durable, "FINISHING", 3)
    store, calls = HeldFinishes(), []
    handler = debate(llm(calls, wait=True), rounds=1).as_handler(store=store)
    runs = [asyncio.create_task(handler({"input": "q"}, request_id=f"r{n}")) for n in range(10)]
    await asyncio.wait_for(store.full_at(3), 10)
    await asyncio.sleep(0.05)  # every debate has ended by now: the other 7 wait their turn
    assert (store.waiting, store.most) == (3, 3)
    store.gate.set()
    results = await asyncio.gather(*runs)
    assert [r["debateStatus"] for r in results] == ["completed"] * 10
    assert store.most == 3
    for n in range(10):
        assert await store.get_result(debate_key("gc", f"r{n}")) is not None


async def test_a_debate_waiting_for_its_turn_to_finish_keeps_its_lease(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One slot; the first debate's finish is held for longer than the lease's ttl: the second,
    ended and waiting for the slot, still holds a live lease (renewed), so no duplicate of its
    request could take its debate over meanwhile."""
    monkeypatch.setattr(durable, "FINISHING", 1)
    store, calls = HeldFinishes(), []
    # Renewed every 0.5 s: a stall of a second between renewals still leaves the lease live.
    ttl = 1.5
    handler = debate(llm(calls, wait=True), rounds=1).as_handler(store=store, lease_ttl_s=ttl)
    first = asyncio.create_task(handler({"input": "q"}, request_id="r1"))
    await asyncio.wait_for(store.full_at(1), 10)
    per_debate = len(calls)  # the first debate's model calls, all made
    second = asyncio.create_task(handler({"input": "q"}, request_id="r2"))
    for _ in range(1000):  # its model calls take milliseconds
        if len(calls) == 2 * per_debate:
            break
        await asyncio.sleep(0.01)
    assert len(calls) == 2 * per_debate, "the second debate never ended"
    await asyncio.sleep(ttl + 0.3)  # ended, waiting for the slot: past a ttl since then
    assert store.waiting == 1 and not second.done()
    lease = await store.get_lease(debate_key("gc", "r2"))
    assert lease is not None, "the waiting debate's lease lapsed"
    store.gate.set()
    assert [r["debateStatus"] for r in await asyncio.gather(first, second)] == ["completed"] * 2


class SlowFinishes(MemoryCheckpointStore):
    async def finish(self, debate_id: str, owner: str, result: bytes, *,
                     retention_s: float | None = None) -> None:
        await asyncio.sleep(0.01)  # so that debates queue for the slots
        await super().finish(debate_id, owner, result, retention_s=retention_s)


def test_a_handler_serves_one_event_loop_after_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """The finishing slots belong to the loop that uses them: a handler reused by a second
    ``asyncio.run`` does not find them bound to the first loop."""
    monkeypatch.setattr(durable, "FINISHING", 1)
    calls: list[str] = []
    handler = debate(llm(calls, wait=True), rounds=1).as_handler(store=SlowFinishes())

    async def five(tag: str) -> list[str]:
        results = await asyncio.gather(*(handler({"input": "q"}, request_id=f"{tag}{n}")
                                         for n in range(5)))
        return [r["debateStatus"] for r in results]

    assert asyncio.run(five("a")) == ["completed"] * 5
    assert asyncio.run(five("b")) == ["completed"] * 5
