"""The lease keeper with thousands of debates in flight: every lease renewed each ttl/3, a chunk
of them at a time rather than a task for each at once."""

from __future__ import annotations

import asyncio
from typing import Any

from debatebus.handlers._leases import CHUNKS_AT_ONCE, RENEWALS_AT_ONCE, LeaseKeeper


class CountingStore:
    """Renews any lease after a moment; counts renewals and how many were under way at once."""

    def __init__(self, leases: int, delay_s: float = 0.001) -> None:
        self.delay_s = delay_s
        self.renewed: dict[str, int] = {}
        self.now = self.most = 0
        self.leases = leases
        self.all_renewed = asyncio.Event()

    async def renew_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.now -= 1
        self.renewed[owner] = self.renewed.get(owner, 0) + 1
        if len(self.renewed) == self.leases:
            self.all_renewed.set()
        return True


async def keep_until(keeper: LeaseKeeper, owners: list[str], done: asyncio.Event,
                     timeout: float) -> None:
    """Track a lease for each of ``owners`` (one stand-in run for all) until ``done``."""
    run: asyncio.Task[Any] = asyncio.create_task(asyncio.sleep(60))
    for owner in owners:
        keeper.track(owner, f"debate-{owner}", run)
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        for owner in owners:
            keeper.untrack(owner)
        run.cancel()


async def test_thousands_of_leases_are_all_renewed_a_chunk_at_a_time() -> None:
    owners = [f"owner-{i}" for i in range(2_500)]
    store = CountingStore(len(owners))
    keeper = LeaseKeeper(store, ttl_s=0.3)  # type: ignore[arg-type]  # renew_lease is all it uses
    await keep_until(keeper, owners, store.all_renewed, 10)
    assert set(store.renewed) == set(owners)
    assert 0 < store.most <= CHUNKS_AT_ONCE * RENEWALS_AT_ONCE < len(owners)
    assert not keeper.lost and not keeper.failing


async def test_chunks_slower_than_a_second_overlap_only_so_far() -> None:
    """Each renewal takes 2.5 s, so a chunk is still going when the next two may start, a second
    apart: chunks overlap, but never more of them than the cap (unbounded, all 3 were under way
    at once)."""
    owners = [f"owner-{i}" for i in range(3 * RENEWALS_AT_ONCE)]
    store = CountingStore(len(owners), delay_s=2.5)
    keeper = LeaseKeeper(store, ttl_s=3.0)  # type: ignore[arg-type]  # renew_lease is all it uses
    await keep_until(keeper, owners, store.all_renewed, 30)
    assert store.most == CHUNKS_AT_ONCE * RENEWALS_AT_ONCE < len(owners)


class SlowStore:
    """Each renewal takes ``delay_s``; records when each of ``watched`` was renewed, and says
    when both were renewed three times."""

    def __init__(self, delay_s: float, watched: tuple[str, str]) -> None:
        self.delay_s = delay_s
        self.times: dict[str, list[float]] = {owner: [] for owner in watched}
        self.seen_enough = asyncio.Event()

    async def renew_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        await asyncio.sleep(self.delay_s)
        if owner in self.times:
            self.times[owner].append(asyncio.get_running_loop().time())
            if min(map(len, self.times.values())) >= 3:
                self.seen_enough.set()
        return True


async def test_with_a_slow_store_the_next_round_of_renewals_starts_at_once() -> None:
    """3 chunks of 1,000 leases, each chunk 0.8 s to renew: a round takes at least 2.4 s, as long
    as ttl/3 (longer on a busy machine). The next round must start as soon as it ends, not ttl/3
    later: waiting ttl/3 after every round renews a lease every ttl/3 plus a round's length, which
    with a slow store outlasts the ttl. Measured between a round's last renewal and the next
    round's first, which does not depend on how long the rounds themselves take."""
    owners = [f"owner-{i}" for i in range(3_000)]
    first, last = owners[0], owners[-1]  # renewed in a round's first chunk, and in its last
    store = SlowStore(0.8, (first, last))
    keeper = LeaseKeeper(store, ttl_s=7.2)  # type: ignore[arg-type]  # renew_lease is all it uses
    await keep_until(keeper, owners, store.seen_enough, 60)
    ends, next_starts = store.times[last][:2], store.times[first][1:3]
    waits = [start - end for end, start in zip(ends, next_starts, strict=True)]
    # One chunk's 0.8 s, at once: 0.8 s and more (the first chunk of the next round); with ttl/3
    # waited after each round, 3.2 s and more. The bound between leaves a loaded machine 1.6 s.
    assert all(0.7 < wait < 2.4 for wait in waits), waits
