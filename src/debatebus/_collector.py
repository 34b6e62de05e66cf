"""Python's cyclic garbage collector while a worker serves: ``DebateBus(collector=...)``.

A debate in flight holds a few dozen container objects (its coroutines, its transcript, the
request being answered), so a worker with 20,000 in flight tracks over a million. Each *full*
collection walks all of them (about a second on a slow core, with the event loop stopped), and
with Python's default thresholds a burst of debates sets off dozens: the debates' objects live for
seconds, so nearly all of them are promoted to the oldest generation, and Python runs a full
collection every 10 collections of the middle one once the oldest has grown by a quarter.

``Collector`` applies, for as long as the worker serves (and restores after), process-wide:

* ``freeze``: after start-up (modules, the app, its clients, connected), one collection, then
  ``gc.freeze()``: what exists then is never walked again;
* ``thresholds``: ``gc.set_threshold``. The default, (50000, 10, 10), collects the youngest
  generation once 50,000 more objects were made than freed (Python: 700), the middle one every
  10 of those (500,000) and the oldest every 10 of the middle one's (5 million; Python: 70,000,
  and with both only once the oldest has grown by a quarter). A debate's objects live as long as
  its model calls (seconds): collected every 700, most are walked in the young generations
  before they die, and those that live on are walked again by every full collection; in 50,000
  most are gone before a collection comes (docs/scaling.md: at 5,000 debates in flight, 0.03
  ms of collecting per debate instead of 0.23). A debate leaves no reference cycles behind (its
  objects are freed by reference counting: ``tests/test_collector.py``), so this holds back no
  memory of the worker's own; cycles that user code makes (an LLM client's) wait longer, up to
  50,000 objects' worth, and those that lived long, for a full collection.

``Collector(freeze=False, thresholds=None)`` leaves the collector as it is.

The collector is the process's, so a ``DebateBus`` leaves it alone unless given one
(``DebateBus(collector=Collector())``): an app embedding a worker keeps its own settings. The
``debatebus worker`` command owns its process and serves with ``DEFAULT_COLLECTOR`` unless the app
says otherwise. Workers serving at once in one process share one setting: the first to start
applies its own, and it stays until the last one stops.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass

from debatebus.exceptions import ConfigError

DEFAULT_THRESHOLDS = (50_000, 10, 10)


@dataclass(frozen=True, slots=True)
class Collector:
    """How a worker sets Python's cyclic garbage collector while it serves (module docstring)."""

    freeze: bool = True
    thresholds: tuple[int, int, int] | None = DEFAULT_THRESHOLDS

    def __post_init__(self) -> None:
        if self.thresholds is not None and (
            len(self.thresholds) != 3 or any(t < 0 for t in self.thresholds)
        ):
            raise ConfigError(f"collector thresholds are gc.set_threshold's three counts "
                              f"(≥ 0; 0 0 0 turns automatic collection off), got "
                              f"{self.thresholds!r}")

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Applied within the block (a worker's serving, after start-up), restored after; a
        block within another one's (a second worker in the process) changes nothing."""
        if _SERVING.blocks:
            _SERVING.blocks += 1
            try:
                yield
            finally:
                _SERVING.blocks -= 1
            return
        before = gc.get_threshold()
        if self.thresholds is not None:
            gc.set_threshold(*self.thresholds)
        if self.freeze:
            gc.collect()  # garbage frozen now would never be freed
            gc.freeze()
        _SERVING.blocks = 1
        try:
            yield
        finally:
            _SERVING.blocks = 0
            if self.freeze:
                gc.unfreeze()
            gc.set_threshold(*before)


@dataclass(slots=True)
class _Serving:
    """How many ``serving`` blocks are open in the process: the collector is the process's."""

    blocks: int = 0


_SERVING = _Serving()

#: What ``debatebus worker`` serves with unless its app says otherwise: frozen after start-up,
#: ``DEFAULT_THRESHOLDS``.
DEFAULT_COLLECTOR = Collector()
