"""In-process checkpoint store: for tests, the embedded demo and single-process runs.

Nothing survives the process; leases only arbitrate between tasks of this process. What expired
is invisible at once and swept out by a write at most every ``PURGE_EVERY_S`` (or by
``purge_expired``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from debatebus._retention import DEFAULT_RETENTION_S
from debatebus.checkpoints._base import CheckpointStore, Counters, Lease, StoredCheckpoint
from debatebus.checkpoints._common import (
    COUNTERS_SIZE,
    Sweeps,
    lease_ttl_ms,
    marker_ms,
    not_begun,
)


def _until(now: float, keep_ms: int | None) -> float:
    """When something written at ``now`` (time.monotonic()) and kept ``keep_ms`` expires."""
    return math.inf if keep_ms is None else now + keep_ms / 1000


@dataclass(slots=True)
class _Checkpoint:
    header: bytes
    expires_at: float
    entries: list[bytes] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)


@dataclass(frozen=True, slots=True)
class _Result:
    body: bytes
    expires_at: float
    forget_at: float  # when the finished marker goes too


@dataclass(slots=True)
class _HeldLease:
    owner: str
    expires_at: float  # time.monotonic(): only this process reads it

    def live(self, now: float) -> bool:
        return self.expires_at > now


class MemoryCheckpointStore(CheckpointStore):
    """Dicts keyed by debate id. Every method completes without awaiting, so each is atomic
    with respect to other tasks on the loop."""

    def __init__(self, *, retention_s: float = DEFAULT_RETENTION_S) -> None:
        super().__init__(retention_s=retention_s)
        self._checkpoints: dict[str, _Checkpoint] = {}
        self._results: dict[str, _Result] = {}
        self._leases: dict[str, _HeldLease] = {}
        self._sweeps = Sweeps()

    def purge_expired(self) -> int:
        """Drop every expired checkpoint and result body, and every marker past its time; how
        many checkpoints and results went."""
        now = time.monotonic()
        gone = [i for i, c in self._checkpoints.items() if c.expires_at <= now]
        for debate_id in gone:
            del self._checkpoints[debate_id]
        expired = [i for i, r in self._results.items() if r.expires_at <= now and r.body]
        for debate_id in expired:  # the body goes; the marker stays until forget_at
            self._results[debate_id] = replace(self._results[debate_id], body=b"")
        forgotten = [i for i, r in self._results.items() if r.forget_at <= now]
        for debate_id in forgotten:
            del self._results[debate_id]
        return len(gone) + len(expired)

    def _now(self) -> float:
        """The time for a write, which sweeps out what expired when a sweep is due."""
        now = time.monotonic()
        if self._sweeps.due(now):
            self.purge_expired()
        return now

    def _live_checkpoint(self, debate_id: str) -> _Checkpoint | None:
        checkpoint = self._checkpoints.get(debate_id)
        if checkpoint is None or checkpoint.expires_at <= time.monotonic():
            return None
        return checkpoint

    def _live_result(self, debate_id: str) -> _Result | None:
        result = self._results.get(debate_id)
        if result is None or result.expires_at <= time.monotonic():
            return None
        return result

    # ---- checkpoints --------------------------------------------------------------------------

    async def begin(self, debate_id: str, header: bytes, *,
                    retention_s: float | None = None) -> bytes:
        checkpoint = self._live_checkpoint(debate_id)
        if checkpoint is None:
            checkpoint = _Checkpoint(bytes(header), _until(self._now(), self.keep_ms(retention_s)))
            self._checkpoints[debate_id] = checkpoint
        return checkpoint.header

    async def append(self, debate_id: str, entry: bytes, counters: Counters, *,
                     retention_s: float | None = None) -> int:
        checkpoint = self._live_checkpoint(debate_id)
        if checkpoint is None:
            raise not_begun(debate_id)
        checkpoint.entries.append(bytes(entry))
        checkpoint.counters = counters
        checkpoint.expires_at = _until(self._now(), self.keep_ms(retention_s))
        return len(checkpoint.entries)

    async def load(self, debate_id: str) -> StoredCheckpoint | None:
        checkpoint = self._live_checkpoint(debate_id)
        if checkpoint is None:
            return None
        # A copy, so a caller appending to the list cannot change what is stored.
        return StoredCheckpoint(checkpoint.header, list(checkpoint.entries), checkpoint.counters)

    async def size_bytes(self, debate_id: str) -> int:
        checkpoint = self._live_checkpoint(debate_id)
        if checkpoint is None:
            return 0
        return len(checkpoint.header) + sum(map(len, checkpoint.entries)) + COUNTERS_SIZE

    # ---- results ------------------------------------------------------------------------------

    async def put_result(self, debate_id: str, result: bytes, *,
                         retention_s: float | None = None) -> None:
        now, keep = self._now(), self.keep_ms(retention_s)
        self._results[debate_id] = _Result(bytes(result), _until(now, keep),
                                           _until(now, marker_ms(keep)))
        self._checkpoints.pop(debate_id, None)

    async def get_result(self, debate_id: str) -> bytes | None:
        result = self._live_result(debate_id)
        return None if result is None else result.body

    async def result_expired(self, debate_id: str) -> bool:
        result = self._results.get(debate_id)
        return result is not None and result.expires_at <= time.monotonic() < result.forget_at

    async def has_results(self, debate_ids: list[str]) -> list[bool]:
        return [self._live_result(debate_id) is not None for debate_id in debate_ids]

    # ---- leases -------------------------------------------------------------------------------

    async def acquire_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        ttl = lease_ttl_ms(ttl_s) / 1000
        now = time.monotonic()
        lease = self._leases.get(debate_id)
        if lease is not None and lease.live(now) and lease.owner != owner:
            return False
        self._leases[debate_id] = _HeldLease(owner, now + ttl)
        return True

    async def renew_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        ttl = lease_ttl_ms(ttl_s) / 1000
        now = time.monotonic()
        lease = self._leases.get(debate_id)
        # An expired lease is not renewed even if nobody took it: the owner must notice it lapsed
        # (as with Redis, where the key is gone by then).
        if lease is None or not lease.live(now) or lease.owner != owner:
            return False
        lease.expires_at = now + ttl
        return True

    async def release_lease(self, debate_id: str, owner: str) -> None:
        lease = self._leases.get(debate_id)
        if lease is not None and lease.owner == owner:
            del self._leases[debate_id]

    async def get_lease(self, debate_id: str) -> Lease | None:
        now = time.monotonic()
        lease = self._leases.get(debate_id)
        if lease is None or not lease.live(now):
            return None
        return Lease(lease.owner, lease.expires_at - now)
