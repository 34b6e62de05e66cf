"""What the Redis transports (Streams and pub/sub) share beyond ``debatebus._redis``: their logger,
and their blocking reads: counted (``ReadTracker``, so ``close`` lets them return first) and run
side by side (``SlotReads``: one per hash slot of a cluster; ``merge``: several iterators)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Generic, TypeVar

from debatebus.transports._base import Delivery

T = TypeVar("T")

log = logging.getLogger("debatebus.transports.redis")


class ReadTracker:
    """Counts blocking reads in flight, so ``close()`` lets them return before it closes the pool:
    a pool closed under a read makes redis-py's retry reconnect a socket that nobody closes."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        self._count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._count -= 1
            if not self._count:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)


async def merge(*sources: AsyncIterator[Delivery]) -> AsyncIterator[Delivery]:
    """Interleave several iterators until all end; the first error ends the merge and is raised."""
    queue: asyncio.Queue[Delivery | BaseException | None] = asyncio.Queue(maxsize=64)

    async def pump(source: AsyncIterator[Delivery]) -> None:
        try:
            async for item in source:
                await queue.put(item)
        except Exception as e:
            await queue.put(e)
        await queue.put(None)

    tasks = [asyncio.create_task(pump(source)) for source in sources]
    running = len(tasks)
    try:
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


class SlotReads(Generic[T]):
    """Blocking reads, one per slot, run at once: ``next`` waits for the first answer, and a read
    still running when it returns is kept running for the next call. Nothing a read got is
    dropped: when a read fails, its error is raised at once and what the reads that ended with
    it got is the next call's answer; ``stop`` hands back what nobody took."""

    def __init__(self, reads: Sequence[Callable[[], Awaitable[list[T]]]]) -> None:
        self._reads = reads
        self._running: dict[int, asyncio.Future[list[T]]] = {}
        self._ready: list[T] = []  # got by reads that ended with a failed one

    async def next(self) -> list[T]:
        if self._ready:
            out, self._ready = self._ready, []
            return out
        for n, read in enumerate(self._reads):
            if n not in self._running:
                self._running[n] = asyncio.ensure_future(read())
        await asyncio.wait(self._running.values(), return_when=asyncio.FIRST_COMPLETED)
        out = []
        error: BaseException | None = None
        for n, task in list(self._running.items()):
            if task.done():
                del self._running[n]  # run again at the next call, failed or not
                if task.exception() is None:
                    out += task.result()
                else:  # two reads failing in the same round: the first one's error is raised
                    error = error or task.exception()
        if error is not None:
            self._ready = out
            raise error
        return out

    def stop(self) -> list[T]:
        """Cancel the reads still running; what the finished ones got, never handed out."""
        out, self._ready = self._ready, []
        for task in self._running.values():
            if task.done() and not task.cancelled() and task.exception() is None:
                out += task.result()
            task.cancel()
        self._running.clear()
        return out
