"""SQLite checkpoint store: the embedded default for one host (stdlib sqlite3, WAL).

Every call runs on one dedicated worker thread that owns the connection, so the event loop never
blocks on disk I/O and the connection is never shared between threads. Several processes may
open the same file: writes take ``BEGIN IMMEDIATE``, and a write that finds another process's
write under way waits for it up to the busy timeout, half the store's ``timeout_s`` (then it
fails with ``TransportError``), so the one thread is free again before the call's own bound ends
and the calls queued behind it (a lease renewal) get their turn. Expiry is wall-clock time, which
all processes on the host agree on.

Expired checkpoints and results are invisible to reads (``expires_at``) and swept out by a write
at most every ``PURGE_EVERY_S`` (or by ``purge_expired``), so the file stays bounded without a
background task.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from debatebus._retention import DEFAULT_RETENTION_S
from debatebus.checkpoints._base import (
    DEFAULT_TIMEOUT_S,
    CheckpointStore,
    Counters,
    Lease,
    StoredCheckpoint,
)
from debatebus.checkpoints._common import (
    COUNTERS_SIZE,
    Sweeps,
    lease_ttl_ms,
    marker_ms,
    not_begun,
)
from debatebus.exceptions import TransportError

T = TypeVar("T")

#: The busy timeout's share of a call's ``timeout_s``: a statement waiting on another process's
#: lock gives up while its call still waits, never holding the store's one thread past it.
BUSY_SHARE = 0.5
# Bound on ids per ``IN (...)`` so has_results never hits SQLITE_MAX_VARIABLE_NUMBER.
_IN_CHUNK = 500

_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    debate_id TEXT PRIMARY KEY,
    header BLOB NOT NULL,
    n_entries INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    total_tokens INTEGER NOT NULL DEFAULT 0,
    calls INTEGER NOT NULL DEFAULT 0,
    expires_at REAL
);
CREATE TABLE IF NOT EXISTS entries (
    debate_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (debate_id, seq)
);
CREATE TABLE IF NOT EXISTS results (
    debate_id TEXT PRIMARY KEY,
    body BLOB NOT NULL,
    expires_at REAL
);
CREATE TABLE IF NOT EXISTS finished (
    debate_id TEXT PRIMARY KEY,
    forget_at REAL
);
CREATE TABLE IF NOT EXISTS leases (
    debate_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires_at REAL NOT NULL
);
"""
# After _SCHEMA and the migration: a file from before retention has no checkpoints.expires_at.
_INDEXES = """
CREATE INDEX IF NOT EXISTS results_expiry ON results (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS checkpoints_expiry ON checkpoints (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS finished_expiry ON finished (forget_at) WHERE forget_at IS NOT NULL;
"""
_LIVE = "(expires_at IS NULL OR expires_at > ?)"


@contextlib.contextmanager
def _write(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    # IMMEDIATE takes the write lock up front: a deferred transaction that upgrades later can get
    # SQLITE_BUSY without the busy handler ever waiting, which would break cross-process writers.
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.rollback()
        raise
    db.commit()


@contextlib.contextmanager
def _read(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    # One read transaction = one WAL snapshot, so header, entries and counters agree.
    db.execute("BEGIN")
    try:
        yield db
    finally:
        db.rollback()


def _open(path: str, busy_timeout_s: float) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; _write/_read say exactly where they are.
    db = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
    try:
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: durable across app crashes
        db.executescript(_SCHEMA)
        with _write(db):  # one process migrates; the others then see the column
            columns = {row[1] for row in db.execute("PRAGMA table_info(checkpoints)")}
            if "expires_at" not in columns:
                db.execute("ALTER TABLE checkpoints ADD COLUMN expires_at REAL")
        db.executescript(_INDEXES)
    except BaseException:
        db.close()
        raise
    return db


def _until(keep_ms: int | None) -> float | None:
    """The wall-clock time something written now and kept ``keep_ms`` expires (None: never)."""
    return None if keep_ms is None else time.time() + keep_ms / 1000


def _drop_expired_checkpoint(db: sqlite3.Connection, debate_id: str) -> None:
    row = db.execute("DELETE FROM checkpoints WHERE debate_id = ? AND expires_at <= ? "
                     "RETURNING 1", (debate_id, time.time())).fetchone()
    if row is not None:
        db.execute("DELETE FROM entries WHERE debate_id = ?", (debate_id,))


def _purge(db: sqlite3.Connection) -> int:
    """Inside a write transaction: delete what expired (the partial indexes find it)."""
    now = time.time()
    gone = db.execute("DELETE FROM checkpoints WHERE expires_at <= ? RETURNING debate_id",
                      (now,)).fetchall()
    db.executemany("DELETE FROM entries WHERE debate_id = ?", gone)
    results = db.execute("DELETE FROM results WHERE expires_at <= ?", (now,)).rowcount
    db.execute("DELETE FROM finished WHERE forget_at <= ?", (now,))
    return len(gone) + results


class SQLiteCheckpointStore(CheckpointStore):
    """Checkpoints in a SQLite file, kept ``retention_s`` after their last write.
    Every call is bounded by ``timeout_s`` (a file locked by another process past the busy
    timeout, a stalled disk): past it, a ``TransportError`` saying so."""

    def __init__(self, path: str | Path, *, retention_s: float = DEFAULT_RETENTION_S,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(retention_s=retention_s)
        self.path = str(path)
        self.timeout_s = timeout_s
        self._sweeps = Sweeps()
        self._worker: tuple[ThreadPoolExecutor, sqlite3.Connection] | None = None
        self._connecting = asyncio.Lock()

    # ---- plumbing -----------------------------------------------------------------------------

    async def connect(self) -> None:
        await self._connected()

    async def _connected(self) -> tuple[ThreadPoolExecutor, sqlite3.Connection]:
        async with self._connecting:
            if self._worker is not None:
                return self._worker
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="debatebus-sqlite")
            try:
                db = await self._on(executor,
                                    lambda: _open(self.path, self.timeout_s * BUSY_SHARE))
            except BaseException:
                executor.shutdown(wait=False)
                raise
            self._worker = (executor, db)
            return self._worker

    async def close(self) -> None:
        if self._worker is None:
            return
        (executor, db), self._worker = self._worker, None
        try:
            await self._on(executor, db.close)
        finally:
            executor.shutdown(wait=False)  # the queue is empty: the thread exits on its own

    async def _on(self, executor: ThreadPoolExecutor, fn: Callable[[], T]) -> T:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await asyncio.get_running_loop().run_in_executor(executor, fn)
        except TimeoutError:
            raise TransportError(
                f"SQLite checkpoint store {self.path!r} did not answer within {self.timeout_s:g} s:"
                " check the disk and whether another process holds the file locked") from None
        except sqlite3.Error as exc:
            raise TransportError(
                f"SQLite checkpoint store {self.path!r} failed: {exc}. Check that the directory "
                "exists and is writable, the disk is not full, and the file is on a local disk "
                "(WAL needs shared memory: not NFS)"
            ) from exc

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        executor, db = self._worker or await self._connected()
        return await self._on(executor, lambda: fn(db))

    # ---- checkpoints --------------------------------------------------------------------------

    async def begin(self, debate_id: str, header: bytes, *,
                    retention_s: float | None = None) -> bytes:
        expires_at = _until(self.keep_ms(retention_s))

        def op(db: sqlite3.Connection) -> bytes:
            with _write(db):
                _drop_expired_checkpoint(db, debate_id)
                db.execute(
                    "INSERT INTO checkpoints (debate_id, header, expires_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (debate_id) DO NOTHING",
                    (debate_id, header, expires_at),
                )
                row = db.execute(
                    "SELECT header FROM checkpoints WHERE debate_id = ?", (debate_id,)
                ).fetchone()
            return bytes(row[0])

        return await self._run(op)

    async def append(self, debate_id: str, entry: bytes, counters: Counters, *,
                     retention_s: float | None = None) -> int:
        keep = self.keep_ms(retention_s)

        def op(db: sqlite3.Connection) -> int:
            with _write(db):
                row = db.execute(
                    "UPDATE checkpoints SET n_entries = n_entries + 1, prompt_tokens = ?, "
                    "completion_tokens = ?, total_tokens = ?, calls = ?, expires_at = ? "
                    f"WHERE debate_id = ? AND {_LIVE} RETURNING n_entries",
                    (counters.prompt_tokens, counters.completion_tokens, counters.total_tokens,
                     counters.calls, _until(keep), debate_id, time.time()),
                ).fetchone()
                if row is None:
                    raise not_begun(debate_id)
                # seq is the 1-based entry number; earlier rows are never touched again.
                db.execute(
                    "INSERT INTO entries (debate_id, seq, body) VALUES (?, ?, ?)",
                    (debate_id, row[0], entry),
                )
            return int(row[0])

        return await self._run(op)

    async def load(self, debate_id: str) -> StoredCheckpoint | None:
        def op(db: sqlite3.Connection) -> StoredCheckpoint | None:
            with _read(db):
                row = db.execute(
                    "SELECT header, prompt_tokens, completion_tokens, total_tokens, calls "
                    f"FROM checkpoints WHERE debate_id = ? AND {_LIVE}",
                    (debate_id, time.time()),
                ).fetchone()
                if row is None:
                    return None
                bodies = db.execute(
                    "SELECT body FROM entries WHERE debate_id = ? ORDER BY seq", (debate_id,)
                ).fetchall()
            counters = Counters(*(int(v) for v in row[1:]))
            return StoredCheckpoint(bytes(row[0]), [bytes(b[0]) for b in bodies], counters)

        return await self._run(op)

    async def size_bytes(self, debate_id: str) -> int:
        def op(db: sqlite3.Connection) -> int:
            row = db.execute(
                "SELECT length(header), (SELECT coalesce(sum(length(body)), 0) FROM entries "
                "WHERE debate_id = ?1) FROM checkpoints WHERE debate_id = ?1 "
                "AND (expires_at IS NULL OR expires_at > ?2)",
                (debate_id, time.time()),
            ).fetchone()
            return 0 if row is None else int(row[0]) + int(row[1]) + COUNTERS_SIZE

        return await self._run(op)

    # ---- results ------------------------------------------------------------------------------

    async def put_result(self, debate_id: str, result: bytes, *,
                         retention_s: float | None = None) -> None:
        keep = self.keep_ms(retention_s)
        sweep = self._sweeps.due(time.monotonic())

        def op(db: sqlite3.Connection) -> None:
            with _write(db):
                db.execute(
                    "INSERT INTO results (debate_id, body, expires_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (debate_id) DO UPDATE SET body = excluded.body, "
                    "expires_at = excluded.expires_at",
                    (debate_id, result, _until(keep)),
                )
                db.execute(
                    "INSERT INTO finished (debate_id, forget_at) VALUES (?, ?) "
                    "ON CONFLICT (debate_id) DO UPDATE SET forget_at = excluded.forget_at",
                    (debate_id, _until(marker_ms(keep))),
                )
                db.execute("DELETE FROM entries WHERE debate_id = ?", (debate_id,))
                db.execute("DELETE FROM checkpoints WHERE debate_id = ?", (debate_id,))
                if sweep:
                    _purge(db)

        await self._run(op)

    async def purge_expired(self) -> int:
        """Delete every expired checkpoint and result, and every marker past its time; how many
        checkpoints and results went."""
        def op(db: sqlite3.Connection) -> int:
            with _write(db):
                return _purge(db)

        return await self._run(op)

    async def get_result(self, debate_id: str) -> bytes | None:
        def op(db: sqlite3.Connection) -> bytes | None:
            row = db.execute(
                f"SELECT body FROM results WHERE debate_id = ? AND {_LIVE}",
                (debate_id, time.time()),
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self._run(op)

    async def result_expired(self, debate_id: str) -> bool:
        def op(db: sqlite3.Connection) -> bool:
            now = time.time()
            row = db.execute(
                "SELECT 1 FROM finished WHERE debate_id = ?1 "
                "AND (forget_at IS NULL OR forget_at > ?2) AND NOT EXISTS (SELECT 1 FROM results "
                "WHERE debate_id = ?1 AND (expires_at IS NULL OR expires_at > ?2))",
                (debate_id, now),
            ).fetchone()
            return row is not None

        return await self._run(op)

    async def has_results(self, debate_ids: list[str]) -> list[bool]:
        if not debate_ids:
            return []

        def op(db: sqlite3.Connection) -> list[bool]:
            now, found = time.time(), set[str]()
            for start in range(0, len(debate_ids), _IN_CHUNK):
                chunk = debate_ids[start : start + _IN_CHUNK]
                marks = ",".join("?" * len(chunk))
                found.update(
                    row[0]
                    for row in db.execute(
                        f"SELECT debate_id FROM results WHERE debate_id IN ({marks}) "
                        f"AND {_LIVE}",
                        (*chunk, now),
                    )
                )
            return [debate_id in found for debate_id in debate_ids]

        return await self._run(op)

    # ---- leases -------------------------------------------------------------------------------

    async def acquire_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        ttl = lease_ttl_ms(ttl_s) / 1000

        def op(db: sqlite3.Connection) -> bool:
            now = time.time()
            with _write(db):
                # The upsert only overwrites a row that is ours or expired, so rowcount says
                # whether we hold the lease; BEGIN IMMEDIATE makes it atomic across processes.
                cursor = db.execute(
                    "INSERT INTO leases (debate_id, owner, expires_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (debate_id) DO UPDATE SET owner = excluded.owner, "
                    "expires_at = excluded.expires_at "
                    "WHERE leases.owner = excluded.owner OR leases.expires_at <= ?",
                    (debate_id, owner, now + ttl, now),
                )
            return cursor.rowcount == 1

        return await self._run(op)

    async def renew_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        ttl = lease_ttl_ms(ttl_s) / 1000

        def op(db: sqlite3.Connection) -> bool:
            now = time.time()
            with _write(db):
                cursor = db.execute(
                    "UPDATE leases SET expires_at = ? "
                    "WHERE debate_id = ? AND owner = ? AND expires_at > ?",
                    (now + ttl, debate_id, owner, now),
                )
            return cursor.rowcount == 1

        return await self._run(op)

    async def release_lease(self, debate_id: str, owner: str) -> None:
        def op(db: sqlite3.Connection) -> None:
            with _write(db):
                db.execute(
                    "DELETE FROM leases WHERE debate_id = ? AND owner = ?", (debate_id, owner)
                )

        await self._run(op)

    async def get_lease(self, debate_id: str) -> Lease | None:
        def op(db: sqlite3.Connection) -> Lease | None:
            now = time.time()
            row = db.execute(
                "SELECT owner, expires_at FROM leases WHERE debate_id = ? AND expires_at > ?",
                (debate_id, now),
            ).fetchone()
            return None if row is None else Lease(str(row[0]), float(row[1]) - now)

        return await self._run(op)
