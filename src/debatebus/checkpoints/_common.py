"""Small pieces every store shares, so the three implementations agree on edge cases."""

from __future__ import annotations

from dataclasses import fields

from debatebus.checkpoints.base import Counters
from debatebus.exceptions import ConfigError

__all__ = ["COUNTERS_SIZE", "lease_ttl_ms", "not_begun", "result_ttl_ms"]

# Counters are four integers; the stores that report logical sizes count them as four int64s.
COUNTERS_SIZE = 8 * len(fields(Counters))


def lease_ttl_ms(ttl_s: float) -> int:
    """A lease TTL in whole milliseconds (Redis PX granularity), rejecting nonsense early."""
    if not ttl_s > 0:  # also rejects NaN
        raise ConfigError(f"lease ttl_s must be a positive number of seconds, got {ttl_s!r}")
    return max(1, round(ttl_s * 1000))


def result_ttl_ms(result_ttl_s: float | None) -> int | None:
    if result_ttl_s is None:
        return None
    if not result_ttl_s > 0:
        raise ConfigError(
            f"result_ttl_s must be a positive number of seconds or None (keep forever), "
            f"got {result_ttl_s!r}"
        )
    return max(1, round(result_ttl_s * 1000))


def not_begun(debate_id: str) -> ConfigError:
    # Appending without a header would leave a checkpoint that load() cannot resume from; it also
    # catches a stale worker appending after another one stored the final result.
    return ConfigError(
        f"append() for debate {debate_id!r} before begin(): call begin() first "
        "(or the debate already finished and its checkpoint was replaced by the result)"
    )
