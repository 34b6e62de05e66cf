"""Where durable debates keep their state: the ``CheckpointStore`` interface.

Stores are deliberately dumb: they keep opaque bytes that the handler layer encodes (msgspec), so
every store has the same semantics and the same contract tests. Per debate id a store holds:

- a header (written once, when the debate starts: definition hash, topic, protocol version…);
- an append-only list of entries (the framing, then one entry per committed round/phase) plus small
  counters (token usage and calls) overwritten with each append — storage grows linearly with the
  transcript, never rewriting it;
- the final result, once the debate has ended;
- a lease: which worker runs the debate now, until when.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from types import TracebackType
from typing import Self

__all__ = ["CheckpointStore", "Counters", "Lease", "StoredCheckpoint"]


@dataclass(frozen=True, slots=True)
class Counters:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    calls: int = 0


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    header: bytes
    entries: list[bytes]
    counters: Counters


@dataclass(frozen=True, slots=True)
class Lease:
    owner: str
    expires_in_s: float


class CheckpointStore(abc.ABC):
    """Checkpoints, results and leases by debate id. Implementations: memory, SQLite, Redis."""

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:  # noqa: B027 - optional hook
        """Open connections / create tables; idempotent."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    # ---- checkpoints --------------------------------------------------------------------------

    @abc.abstractmethod
    async def begin(self, debate_id: str, header: bytes) -> bytes:
        """Write ``header`` unless the debate already has one; return the header now stored."""

    @abc.abstractmethod
    async def append(self, debate_id: str, entry: bytes, counters: Counters) -> int:
        """Append one entry and overwrite the counters, atomically; return the entry count."""

    @abc.abstractmethod
    async def load(self, debate_id: str) -> StoredCheckpoint | None:
        """The header, entries in append order and counters; None when nothing was begun."""

    @abc.abstractmethod
    async def size_bytes(self, debate_id: str) -> int:
        """Bytes held for the debate's checkpoint (header + entries + counters), for measuring."""

    # ---- results ------------------------------------------------------------------------------

    @abc.abstractmethod
    async def put_result(self, debate_id: str, result: bytes) -> None:
        """Store the final result (overwriting), and drop the checkpoint entries it supersedes."""

    @abc.abstractmethod
    async def get_result(self, debate_id: str) -> bytes | None: ...

    @abc.abstractmethod
    async def has_results(self, debate_ids: list[str]) -> list[bool]:
        """For each id, whether a final result is stored (one round trip, for ops replay)."""

    # ---- leases -------------------------------------------------------------------------------

    @abc.abstractmethod
    async def acquire_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        """Take the lease if it is free or expired (or already ours); True when we hold it."""

    @abc.abstractmethod
    async def renew_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        """Extend our lease; False when it is no longer ours (expired and taken, or released)."""

    @abc.abstractmethod
    async def release_lease(self, debate_id: str, owner: str) -> None:
        """Drop the lease if it is ours."""

    @abc.abstractmethod
    async def get_lease(self, debate_id: str) -> Lease | None:
        """The live lease, or None when free or expired."""
