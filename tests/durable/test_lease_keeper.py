"""The lease keeper with thousands of debates in flight: every lease renewed each ttl/3, a chunk
of them at a time rather than a task for each at once."""

from __future__ import annotations

import asyncio
from typing import Any

from debatebus.handlers.durable import LeaseKeeper


class CountingStore:
    """Renews any lease after a moment; counts renewals and how many were under way at once."""

    def __init__(self, leases: int) -> None:
        self.renewed: dict[str, int] = {}
        self.now = self.most = 0
        self.leases = leases
        self.all_renewed = asyncio.Event()

    async def renew_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.001)
        finally:
            self.now -= 1
        self.renewed[owner] = self.renewed.get(owner, 0) + 1
        if len(self.renewed) == self.leases:
            self.all_renewed.set()
        return True


async def test_thousands_of_leases_are_all_renewed_a_chunk_at_a_time() -> None:
    owners = [f"owner-{i}" for i in range(2_500)]
    store = CountingStore(len(owners))
    keeper = LeaseKeeper(store, ttl_s=0.3)  # type: ignore[arg-type]  # renew_lease is all it uses
    run: asyncio.Task[Any] = asyncio.create_task(asyncio.sleep(60))
    for owner in owners:
        keeper.track(owner, f"debate-{owner}", run)
    try:
        await asyncio.wait_for(store.all_renewed.wait(), 10)
    finally:
        for owner in owners:
            keeper.untrack(owner)
        run.cancel()
    assert set(store.renewed) == set(owners)
    assert 0 < store.most <= 1_000
    assert not keeper.lost and not keeper.failing
