"""Small pieces every store shares, so the three implementations agree on edge cases."""

from __future__ import annotations

from dataclasses import fields

from debatebus.checkpoints._base import Counters
from debatebus.exceptions import CheckpointMissingError, ConfigError

# Counters are four integers; the stores that report logical sizes count them as four int64s.
COUNTERS_SIZE = 8 * len(fields(Counters))


def lease_ttl_ms(ttl_s: float) -> int:
    """A lease TTL in whole milliseconds (Redis PX granularity), rejecting nonsense early."""
    if not ttl_s > 0:  # also rejects NaN
        raise ConfigError(f"lease ttl_s must be a positive number of seconds, got {ttl_s!r}")
    return max(1, round(ttl_s * 1000))


def marker_ms(keep_ms: int | None) -> int | None:
    """How long a finished marker is kept: as long again as its result, so a request arriving
    up to one retention period after the result expired learns that it did."""
    return None if keep_ms is None else 2 * keep_ms


#: The memory and SQLite stores sweep out what expired at most this often, from a write call.
PURGE_EVERY_S = 60.0


class Sweeps:
    """When a store that filters expired rows on read should next sweep them out."""

    def __init__(self) -> None:
        self._next = 0.0

    def due(self, now: float) -> bool:
        if now < self._next:
            return False
        self._next = now + PURGE_EVERY_S
        return True


def not_begun(debate_id: str) -> CheckpointMissingError:
    # Appending without a header would leave a checkpoint that load() cannot resume from; it also
    # catches a stale worker appending after another one stored the final result, and a store
    # that lost the checkpoint (the durable runner then writes it again from the run's progress).
    return CheckpointMissingError(
        f"append() for debate {debate_id!r} before begin(): call begin() first "
        "(or the debate already finished and its checkpoint was replaced by the result)"
    )
