"""Where durable debates keep their state: the ``CheckpointStore`` interface.

Stores are deliberately dumb: they keep opaque bytes that the handler layer encodes (msgspec), so
every store has the same semantics and the same contract tests. Per debate id a store holds:

- a header (written once, when the debate starts: definition hash, topic, protocol version…);
- an append-only list of entries (the framing, then one entry per committed round/phase) plus small
  counters (token usage and calls) overwritten with each append — storage grows linearly with the
  transcript, never rewriting it;
- the final result, once the debate has ended;
- a lease: which worker runs the debate now, until when;
- once the result is stored, a marker that the debate finished.

**Retention.** Checkpoints and results expire ``retention_s`` after their last write (the store's
own, ``DEFAULT_RETENTION_S`` unless given; a handler may pass its own to every write call;
``math.inf`` keeps them forever). The finished marker outlives the result by one more retention
period, so a request for a debate whose result expired is known as such (``Opening.expired``) and
its re-run says so. Leases keep their own short TTL.

Every call of a store that does I/O is bounded by the store's own ``timeout_s``
(``DEFAULT_TIMEOUT_S`` unless given): past it the call raises ``TransportError``, so no debate waits
on a store that stopped answering. The bound lives with the I/O, where it is cheapest: the Redis
store arms one timer per pipeline of calls, not one per call.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from debatebus._retention import DEFAULT_RETENTION_S, retention_ms

#: How long a store call may take before it fails with ``TransportError`` (seconds).
DEFAULT_TIMEOUT_S = 10.0


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


@dataclass(frozen=True, slots=True)
class Opening:
    """What ``start`` found: the stored result of a finished debate; or, when the lease was
    taken, the header now stored, the committed checkpoint and whether the debate's earlier
    result expired; or the live lease of another."""

    result: bytes | None = None
    acquired: bool = False
    header: bytes | None = None
    checkpoint: StoredCheckpoint | None = None
    lease: Lease | None = None
    expired: bool = False


def require_entries(entries: list[bytes]) -> None:
    """``append_many`` appends at least one entry, in every store."""
    if not entries:
        raise ValueError("append_many() needs at least one entry")


def retention_kw(retention_s: float | None) -> dict[str, float]:
    """``retention_s`` as keyword arguments of a store call: none when None (the store's own), so
    a store subclass that overrides a call without the keyword (written before retention
    existed) keeps working wherever no retention of its own is asked for."""
    return {} if retention_s is None else {"retention_s": retention_s}


class CheckpointStore(abc.ABC):
    """Checkpoints, results and leases by debate id. Implementations: memory, SQLite, Redis.

    Every call that writes a checkpoint or a result takes ``retention_s``: None for the store's
    own (``self.retention_s``), else how long to keep what it writes."""

    def __init__(self, *, retention_s: float = DEFAULT_RETENTION_S) -> None:
        self._retention_ms = retention_ms(retention_s)
        self.retention_s = retention_s

    def keep_ms(self, retention_s: float | None) -> int | None:
        """How long to keep what a call writes, in ms (None: forever)."""
        return self._retention_ms if retention_s is None else retention_ms(retention_s)

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
    async def begin(self, debate_id: str, header: bytes, *,
                    retention_s: float | None = None) -> bytes:
        """Write ``header`` unless the debate already has a live one; return the header now
        stored."""

    @abc.abstractmethod
    async def append(self, debate_id: str, entry: bytes, counters: Counters, *,
                     retention_s: float | None = None) -> int:
        """Append one entry and overwrite the counters, atomically; return the entry count.
        The checkpoint's retention starts again."""

    @abc.abstractmethod
    async def load(self, debate_id: str) -> StoredCheckpoint | None:
        """The header, entries in append order and counters; None when nothing was begun."""

    @abc.abstractmethod
    async def size_bytes(self, debate_id: str) -> int:
        """Bytes held for the debate's checkpoint (header + entries + counters), for measuring."""

    # ---- results ------------------------------------------------------------------------------

    @abc.abstractmethod
    async def put_result(self, debate_id: str, result: bytes, *,
                         retention_s: float | None = None) -> None:
        """Store the final result (overwriting) and the finished marker, and drop the checkpoint
        entries it supersedes."""

    @abc.abstractmethod
    async def get_result(self, debate_id: str) -> bytes | None: ...

    @abc.abstractmethod
    async def result_expired(self, debate_id: str) -> bool:
        """Whether the debate's result expired (its finished marker is still kept)."""

    @abc.abstractmethod
    async def has_results(self, debate_ids: list[str]) -> list[bool]:
        """For each id, whether a final result is stored (one round trip, for ops replay)."""

    # ---- composite steps (one round trip each where the store can) ---------------------------

    async def start(self, debate_id: str, owner: str, ttl_s: float, header: bytes, *,
                    retention_s: float | None = None) -> Opening:
        """A delivery's first step: the result if the debate finished; else take the lease and
        write the header if absent, returning what is committed; else who holds the lease."""
        result = await self.get_result(debate_id)
        if result is not None:
            return Opening(result=result)
        if not await self.acquire_lease(debate_id, owner, ttl_s):
            return Opening(lease=await self.get_lease(debate_id))
        result = await self.get_result(debate_id)  # finished just before we took the lease
        if result is not None:
            return Opening(result=result, acquired=True)
        first = await self.begin(debate_id, header, **retention_kw(retention_s))
        return Opening(acquired=True, header=first, checkpoint=await self.load(debate_id),
                       expired=await self.result_expired(debate_id))

    async def append_many(self, debate_id: str, entries: list[bytes], counters: Counters, *,
                          retention_s: float | None = None) -> int:
        """Append several entries (at least one: e.g. the framing with round 1), atomically where
        the store can; the counters after the last. Returns the entry count."""
        require_entries(entries)
        count = 0
        for entry in entries:
            count = await self.append(debate_id, entry, counters, **retention_kw(retention_s))
        return count

    async def finish(self, debate_id: str, owner: str, result: bytes, *,
                     retention_s: float | None = None) -> None:
        """Store the final result and release our lease."""
        await self.put_result(debate_id, result, **retention_kw(retention_s))
        await self.release_lease(debate_id, owner)

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
