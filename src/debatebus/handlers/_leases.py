"""Leases of the debates a durable runner has in flight: all renewed from one background task,
a chunk at a time; a run whose lease another worker took is cancelled, and a lease that lapsed
with nobody holding it (the store was out of reach past its ttl, or lost its data) is taken back.
The task is supervised (``debatebus._supervisor``): an error nobody expected is logged and the
renewals start again; when they keep failing, every run holding a lease is cancelled as if its
lease were lost."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any

from debatebus._backoff import Backoff
from debatebus._supervisor import supervise
from debatebus.checkpoints._base import CheckpointStore
from debatebus.exceptions import TransportError

log = logging.getLogger("debatebus.durable")

#: Leases a keeper renews at once (see ``LeaseKeeper._renew_all``).
RENEWALS_AT_ONCE = 1000
#: Chunks of renewals under way at once, at most.
CHUNKS_AT_ONCE = 2


class LeaseKeeper:
    """Renews every lease this runner holds, every ttl/3, from one background task, and cancels
    the run whose lease could not be renewed. Leases are keyed by their run's own owner."""

    def __init__(self, store: CheckpointStore, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.held: dict[str, tuple[str, asyncio.Task[Any]]] = {}  # owner → (debate id, run)
        self.lost: set[str] = set()
        #: Renewals are failing (logged once per streak, not once per debate and attempt).
        self.failing = False
        self._loop_task: asyncio.Task[None] | None = None

    def track(self, owner: str, debate_id: str, run: asyncio.Task[Any]) -> None:
        self.held[owner] = (debate_id, run)
        if self._loop_task is None or self._loop_task.done():
            # An empty context: the loop serves every debate, so no request's log fields belong
            # on its lines (create_task would copy the first debate's).
            # Run again after at most ttl/6: its first round comes ttl/3 later, so a lease last
            # renewed a round (ttl/3) before the failure is renewed 5/6 of its ttl after that.
            self._loop_task = asyncio.create_task(
                supervise("the lease keeper's renewals", self._renew_forever, log=log,
                          died=self._renewals_died, backoff=Backoff(cap_s=self.ttl_s / 6)),
                context=contextvars.Context())

    def untrack(self, owner: str) -> bool:
        """Stop renewing; True when the lease had been lost meanwhile."""
        self.held.pop(owner, None)
        if owner in self.lost:
            self.lost.discard(owner)
            return True
        return False

    async def _renew_forever(self) -> None:
        """A round of renewals every ttl/3 from the start of the one before, or right after it
        when it took longer: with a slow store, a lease is renewed every round's length, not
        every ttl/3 plus a round's length (which could outlast its ttl)."""
        loop = asyncio.get_running_loop()
        period = self.ttl_s / 3
        due = loop.time() + period
        while self.held:
            await asyncio.sleep(max(0.0, due - loop.time()))
            due = loop.time() + period
            await self._renew_all(list(self.held.items()))

    def _renewals_died(self, exc: Exception) -> None:
        """The renewals kept failing on an error nobody expected: no lease held can be kept, so
        every run holding one stops as if it were lost (its delivery is released)."""
        for owner, (_, run) in list(self.held.items()):
            self.lost.add(owner)
            run.cancel()

    async def _renew_all(self, held: list[tuple[str, tuple[str, asyncio.Task[Any]]]]) -> None:
        """Concurrently: one slow renewal must not delay the others past their expiry. A chunk
        at a time (the store pipelines each), not a task for every lease at once (with thousands
        of debates in flight, that was megabytes every ttl/3); a chunk still going after a second
        overlaps the next, with ``CHUNKS_AT_ONCE`` chunks under way at most. (A method of its
        own: ``held`` must not outlive the round, keeping finished runs.)"""
        going: set[asyncio.Future[list[None]]] = set()
        chunks: list[asyncio.Future[list[None]]] = []
        for start in range(0, len(held), RENEWALS_AT_ONCE):
            chunks.append(asyncio.gather(*(self._renew(owner, debate_id, run) for owner, (
                debate_id, run) in held[start:start + RENEWALS_AT_ONCE])))
            going.add(chunks[-1])
            _, going = await asyncio.wait(going, timeout=1.0)
            if len(going) >= CHUNKS_AT_ONCE:
                _, going = await asyncio.wait(going, return_when=asyncio.FIRST_COMPLETED)
        if going:
            await asyncio.wait(going)
        # asyncio.wait keeps what a chunk raised (an error nobody expected: a store's outage is
        # _renew's) to itself: raised here, for the supervisor, every chunk's read.
        errors = [error for chunk in chunks if (error := chunk.exception()) is not None]
        if errors:
            raise errors[0]

    async def _renew(self, owner: str, debate_id: str, run: asyncio.Task[Any]) -> None:
        try:
            still_ours = await self.store.renew_lease(debate_id, owner, self.ttl_s)
        except TransportError as exc:  # the store may be back before the lease expires
            if not self.failing:
                log.warning("could not renew leases (retrying every %g s): %s", self.ttl_s / 3, exc)
            self.failing = True
            return
        self.failing = False
        if still_ours or owner not in self.held:
            return
        # Not ours any more: another worker took it over, or nobody holds it (it expired while
        # the store was out of reach, or the store lost it: a Redis restarted without its
        # data). Nobody else runs the debate then: take it back and go on.
        try:
            taken_back = await self.store.acquire_lease(debate_id, owner, self.ttl_s)
        except TransportError:
            taken_back = False
        if taken_back:
            log.warning("the lease on debate %s had lapsed with nobody holding it (did the store "
                        "lose its data, e.g. a Redis restart without persistence?): taken back, "
                        "its run goes on", debate_id)
            return
        log.warning("lost the lease on debate %s: stopping its run", debate_id)
        self.lost.add(owner)
        run.cancel()
