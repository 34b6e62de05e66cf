"""asyncio helpers for objects that many tasks, or several event loops, share.

``PerLoop``: an ``asyncio.Lock`` or ``Semaphore`` binds to the loop that first waits on it, and
raises "bound to a different event loop" in any other. A handler, a model or a rate limiter may
serve one loop after another (``asyncio.run`` twice, a test per loop), so each loop gets its own.

``retrieved``: the done callback of a future nobody may await.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """``get()``: the running loop's ``make()``, made on first use there (and forgotten with
    the loop)."""

    __slots__ = ("_by_loop", "_make")

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary())

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        value = self._by_loop.get(loop)
        if value is None:
            value = self._by_loop[loop] = self._make()
        return value


def retrieved(future: asyncio.Future[Any]) -> None:
    """A done callback for a future nobody may await (its callers cancelled meanwhile, or
    none: fire and forget): reads its error, which asyncio would log as never retrieved."""
    if not future.cancelled():
        future.exception()
