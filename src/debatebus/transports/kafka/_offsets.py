"""Offset bookkeeping of a consumer-group member, per assigned partition: what was fetched,
handed out and settled, and so which offset may be committed."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple


class Mark(NamedTuple):
    """What a record held, to recognise it again: a log the broker lost and refilled has other
    records at the same offsets."""

    timestamp: int
    key: bytes | None


@dataclass(eq=False, slots=True)
class Partition:
    """Records fetched from one assigned partition: their order, for contiguous commits, and how
    often each unsettled one was handed out, for delivery counts.

    ``fetched`` may have gaps (compaction, transaction markers): contiguity is over fetched
    records, not integers. A fresh object per assignment, so a late settle for a revoked
    partition is recognised by identity and never commits for the partition's new owner, and
    delivery counts start over at 1 with each owner.
    """

    fetched: deque[int] = field(default_factory=deque)
    unsettled: dict[int, int] = field(default_factory=dict)  # offset -> times handed out
    waiting: set[int] = field(default_factory=set)  # unsettled, in the buffer, not handed out
    #: Handed out, unsettled, its handler waiting on other requests with its slot lent out.
    lent: set[int] = field(default_factory=set)
    last: int = -1  # the highest offset fetched
    marks: dict[int, Mark] = field(default_factory=dict)  # fetched offset -> what it held
    commit_mark: Mark | None = None  # what the record before ``commit_at`` held
    commit_at: int | None = None  # one past the settled prefix: what Kafka should store
    committed: int | None = None

    def add(self, offset: int, mark: Mark | None = None) -> None:
        self.fetched.append(offset)
        if mark is not None:
            self.marks[offset] = mark
        self.unsettled[offset] = 0
        self.waiting.add(offset)
        self.last = offset

    def hand_out(self, offset: int) -> int:
        """Count one more delivery of a waiting record; 0 if it is not waiting any more."""
        if offset not in self.waiting:
            return 0
        self.waiting.discard(offset)
        self.unsettled[offset] += 1
        return self.unsettled[offset]

    def put_back(self, offset: int) -> bool:
        """Mark a handed-out, unsettled record as waiting again; False if it is not one."""
        if offset not in self.unsettled or offset in self.waiting:
            return False
        self.waiting.add(offset)
        self.lent.discard(offset)
        return True

    def lend(self, offset: int, lent: bool) -> bool:
        """Mark a handed-out, unsettled record's slot lent out (``lent``) or taken back; False
        when that changes nothing."""
        if not lent:
            if offset not in self.lent:
                return False
            self.lent.discard(offset)
            return True
        if offset not in self.unsettled or offset in self.waiting or offset in self.lent:
            return False
        self.lent.add(offset)
        return True

    def settle(self, offset: int) -> bool:
        if self.unsettled.pop(offset, None) is None:
            return False
        self.waiting.discard(offset)
        self.lent.discard(offset)
        while self.fetched and self.fetched[0] not in self.unsettled:
            done = self.fetched.popleft()
            self.commit_at, self.commit_mark = done + 1, self.marks.pop(done, None)
        return True

    def forget_from(self, offset: int) -> int:
        """Drop the fetched tail from ``offset`` on (for a revoked partition); returns how many
        unsettled records that dropped."""
        dropped = 0
        while self.fetched and self.fetched[-1] >= offset:
            tail = self.fetched.pop()
            self.waiting.discard(tail)
            self.lent.discard(tail)
            self.marks.pop(tail, None)
            dropped += self.unsettled.pop(tail, None) is not None
        return dropped
