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
* ``thresholds``: ``gc.set_threshold``. The default keeps Python's first two (700, 10) and
  raises the third to 100: a full collection at most every 100 collections of the middle
  generation, so a burst sets off a few instead of dozens. A debate leaves no reference cycles
  behind (its objects are freed by reference counting), so this delays no memory of the
  worker's own; cycles made by user code (an LLM client's) wait longer for a full collection:
  at most about 700 × 10 × 100 new objects' worth.

``Collector(freeze=False, thresholds=None)`` leaves the collector as it is.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass

from debatebus.exceptions import ConfigError

__all__ = ["DEFAULT_COLLECTOR", "DEFAULT_THRESHOLDS", "Collector"]

DEFAULT_THRESHOLDS = (700, 10, 100)


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
        """Applied within the block (a worker's serving, after start-up), restored after."""
        before = gc.get_threshold()
        if self.thresholds is not None:
            gc.set_threshold(*self.thresholds)
        if self.freeze:
            gc.collect()  # garbage frozen now would never be freed
            gc.freeze()
        try:
            yield
        finally:
            if self.freeze:
                gc.unfreeze()
            gc.set_threshold(*before)


#: A worker's unless told otherwise: frozen after start-up, ``DEFAULT_THRESHOLDS``.
DEFAULT_COLLECTOR = Collector()
