"""Counting the event loop's turns: whether it kept running while something else waited."""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType


class LoopTurns:
    """``async with LoopTurns() as turns``: ``turns.count`` is how many turns the event loop has
    given a task of its own, which adds one at each, since the block began."""

    def __init__(self) -> None:
        self.count = 0
        self._task: asyncio.Task[None] | None = None
        self._wanted: tuple[int, asyncio.Event] | None = None

    async def reach(self, count: int) -> None:
        """Return once ``count`` turns have been counted."""
        reached = asyncio.Event()
        self._wanted = (count, reached)
        await reached.wait()

    async def __aenter__(self) -> LoopTurns:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)  # its first turn: counting starts here
        self.count = 0
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _tick(self) -> None:
        while True:
            self.count += 1
            if self._wanted is not None and self.count >= self._wanted[0]:
                self._wanted[1].set()
            await asyncio.sleep(0)
