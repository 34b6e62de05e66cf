"""In-process checkpoint store: for tests, the embedded demo and single-process runs.

Nothing survives the process; leases only arbitrate between tasks of this process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from debatebus.checkpoints._common import COUNTERS_SIZE, lease_ttl_ms, not_begun
from debatebus.checkpoints.base import CheckpointStore, Counters, Lease, StoredCheckpoint

__all__ = ["MemoryCheckpointStore"]


@dataclass(slots=True)
class _Checkpoint:
    header: bytes
    entries: list[bytes] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)


@dataclass(slots=True)
class _HeldLease:
    owner: str
    expires_at: float  # time.monotonic(): only this process reads it

    def live(self, now: float) -> bool:
        return self.expires_at > now


class MemoryCheckpointStore(CheckpointStore):
    """Dicts keyed by debate id. Every method completes without awaiting, so each is atomic
    with respect to other tasks on the loop."""

    def __init__(self) -> None:
        self._checkpoints: dict[str, _Checkpoint] = {}
        self._results: dict[str, bytes] = {}
        self._leases: dict[str, _HeldLease] = {}

    # ---- checkpoints --------------------------------------------------------------------------

    async def begin(self, debate_id: str, header: bytes) -> bytes:
        return self._checkpoints.setdefault(debate_id, _Checkpoint(bytes(header))).header

    async def append(self, debate_id: str, entry: bytes, counters: Counters) -> int:
        checkpoint = self._checkpoints.get(debate_id)
        if checkpoint is None:
            raise not_begun(debate_id)
        checkpoint.entries.append(bytes(entry))
        checkpoint.counters = counters
        return len(checkpoint.entries)

    async def load(self, debate_id: str) -> StoredCheckpoint | None:
        checkpoint = self._checkpoints.get(debate_id)
        if checkpoint is None:
            return None
        # A copy, so a caller appending to the list cannot change what is stored.
        return StoredCheckpoint(checkpoint.header, list(checkpoint.entries), checkpoint.counters)

    async def size_bytes(self, debate_id: str) -> int:
        checkpoint = self._checkpoints.get(debate_id)
        if checkpoint is None:
            return 0
        return len(checkpoint.header) + sum(map(len, checkpoint.entries)) + COUNTERS_SIZE

    # ---- results ------------------------------------------------------------------------------

    async def put_result(self, debate_id: str, result: bytes) -> None:
        self._results[debate_id] = bytes(result)
        self._checkpoints.pop(debate_id, None)

    async def get_result(self, debate_id: str) -> bytes | None:
        return self._results.get(debate_id)

    async def has_results(self, debate_ids: list[str]) -> list[bool]:
        return [debate_id in self._results for debate_id in debate_ids]

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
