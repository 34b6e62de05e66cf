"""Where a checkpoint store under test keeps its data (the store contract's backends)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from debatebus.checkpoints import CheckpointStore


@dataclass
class Backend:
    """Where a store keeps its data. ``make()`` opens another store on the same data, as a second
    worker would (the memory backend can only hand back the same instance); ``retained(s)`` opens
    a store on the same data whose own retention is ``s`` seconds (memory: a store of its own)."""

    name: str
    make: Callable[[], CheckpointStore]
    durable: bool  # a new store instance sees what an earlier one wrote
    retained: Callable[[float], CheckpointStore]
