"""SQLite-only guarantees: several processes share one file, and no call blocks the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tests.support.loop import LoopTurns

from debatebus.checkpoints import Counters, SQLiteCheckpointStore
from debatebus.exceptions import TransportError

# A worker process: waits for "go" on stdin so both workers race, then contends for leases and
# appends to one shared debate, interleaved.
WORKER = """
import asyncio, json, sys
from debatebus.checkpoints import Counters, SQLiteCheckpointStore

async def main(path, owner, n):
    async with SQLiteCheckpointStore(path) as store:
        print("ready", flush=True)
        sys.stdin.readline()
        won, counts = [], []
        for i in range(n):
            won.append(await store.acquire_lease(f"d{i}", owner, 60))
            counts.append(await store.append("shared", owner.encode(), Counters(calls=i)))
    print(json.dumps({"won": won, "counts": counts}), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def _spawn(path: Path, owner: str, n: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WORKER, str(path), owner, str(n)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _race(path: Path, owners: list[str], n: int) -> dict[str, dict[str, list[int]]]:
    procs = {owner: _spawn(path, owner, n) for owner in owners}
    try:
        for proc in procs.values():
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = {owner: proc.communicate(timeout=120)[0] for owner, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert all(proc.returncode == 0 for proc in procs.values()), outputs
    return {owner: json.loads(out.strip().splitlines()[-1]) for owner, out in outputs.items()}


@pytest.mark.slow
async def test_two_processes_share_one_file(tmp_path: Path) -> None:
    path, n = tmp_path / "shared.db", 30
    async with SQLiteCheckpointStore(path) as store:
        await store.begin("shared", b"h")
        results = await asyncio.to_thread(_race, path, ["w1", "w2"], n)
        for i in range(n):  # every lease has exactly one winner
            assert [results[o]["won"][i] for o in ("w1", "w2")].count(True) == 1, i
        counts = results["w1"]["counts"] + results["w2"]["counts"]
        assert sorted(counts) == list(range(1, 2 * n + 1))  # no append lost or numbered twice
        loaded = await store.load("shared")
    assert loaded is not None
    assert sorted(loaded.entries) == [b"w1"] * n + [b"w2"] * n


class WriteLockHolder:
    """Holds the file's write lock from another connection on its own thread until released (or
    for at most ``limit`` seconds, so a store that blocks the loop fails the test, not hangs it)."""

    def __init__(self, path: Path, limit: float = 3.0) -> None:
        self._path, self._limit = path, limit
        self._held, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        db = sqlite3.connect(self._path, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            self._held.set()
            self._release.wait(self._limit)
            db.commit()
        finally:
            db.close()

    def __enter__(self) -> WriteLockHolder:
        self._thread.start()
        assert self._held.wait(10), "could not take the write lock"
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._thread.join(10)


async def test_calls_run_off_the_event_loop(tmp_path: Path) -> None:
    """Another connection holds the write lock, so the store's appends wait in SQLite's busy
    handler; the loop must keep running meanwhile, and the queued appends then land in order."""
    path = tmp_path / "locked.db"
    async with SQLiteCheckpointStore(path) as store:
        await store.begin("d1", b"h")
        async with LoopTurns() as turns:
            # The lock is held until the block ends (30 s at most): a store that blocked the loop
            # would give it its next turn only once the lock is gone and the appends are done.
            with WriteLockHolder(path, limit=30.0):
                appends = [asyncio.create_task(store.append("d1", f"e{i}".encode(),
                                                            Counters(calls=i)))
                           for i in range(200)]
                await turns.reach(100)
                # the loop ran while every append was stuck on the lock
                assert not any(task.done() for task in appends)
            counts = await asyncio.gather(*appends)
        assert counts == list(range(1, 201))  # submitted order is commit order: one worker thread
        loaded = await store.load("d1")
    assert loaded is not None
    assert loaded.entries == [f"e{i}".encode() for i in range(200)]


async def test_ticker_keeps_ticking_during_appends(tmp_path: Path) -> None:
    async with SQLiteCheckpointStore(tmp_path / "t.db") as store:
        await store.begin("d1", b"h")
        async with LoopTurns() as turns:
            for i in range(200):
                await store.append("d1", b"x" * 500, Counters(calls=i))
    assert turns.count >= 200


def _rows(path: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return {table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("checkpoints", "entries", "results", "finished")}


async def test_purge_deletes_what_expired(tmp_path: Path) -> None:
    path = tmp_path / "ttl.db"
    # Retention 1.1 s, marker 2.2 s: each check has about a second of slack on a stalled machine
    # (the sleeps only ever run late, so being past a time is certain).
    async with SQLiteCheckpointStore(path, retention_s=1.1) as store:
        await store.begin("c1", b"h")
        await store.append("c1", b"e1", Counters(calls=1))
        await store.put_result("r1", b"r")
        await store.begin("kept", b"h", retention_s=60)
        assert await store.purge_expired() == 0
        await asyncio.sleep(1.2)  # past the retention, not past the marker (kept 2.2 s)
        assert await store.purge_expired() == 2  # checkpoint c1 (with its entry) and result r1
        assert _rows(path) == {"checkpoints": 1, "entries": 0, "results": 0, "finished": 1}
        assert await store.result_expired("r1") is True
        await asyncio.sleep(1.1)  # 2.3 s in all: past the marker
        assert await store.purge_expired() == 0
        assert _rows(path)["finished"] == 0  # the marker went too
        assert await store.result_expired("r1") is False
        assert await store.begin("kept", b"other") == b"h"


async def test_a_file_from_before_retention_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(
            "CREATE TABLE checkpoints (debate_id TEXT PRIMARY KEY, header BLOB NOT NULL, "
            "n_entries INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0, "
            "completion_tokens INTEGER NOT NULL DEFAULT 0, total_tokens INTEGER NOT NULL "
            "DEFAULT 0, calls INTEGER NOT NULL DEFAULT 0);"
            "INSERT INTO checkpoints (debate_id, header) VALUES ('old', x'68');")
    async with SQLiteCheckpointStore(path) as store:
        loaded = await store.load("old")  # no expiry: kept as before
        assert loaded is not None and loaded.header == b"h"
        await store.append("old", b"e1", Counters(calls=1))
        await store.begin("new", b"h2")
    async with SQLiteCheckpointStore(path) as again:  # migrating twice is a no-op
        assert await again.begin("new", b"other") == b"h2"


async def test_works_without_async_with_and_closes_twice(tmp_path: Path) -> None:
    store = SQLiteCheckpointStore(tmp_path / "lazy.db")
    assert await store.begin("d1", b"h") == b"h"  # connects on first use
    await store.close()
    await store.close()
    assert await store.begin("d1", b"other") == b"h"  # and reconnects after close
    await store.close()


async def test_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    async with SQLiteCheckpointStore(path) as store:
        await store.begin("d1", b"h")
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_unopenable_file_is_a_transport_error(tmp_path: Path) -> None:
    store = SQLiteCheckpointStore(tmp_path / "missing-dir" / "x.db")
    with pytest.raises(TransportError, match="directory exists"):
        await store.connect()


async def test_a_write_stuck_on_another_process_lock_frees_the_thread_within_its_call(
        tmp_path: Path) -> None:
    """Another process holds the write lock past a call's bound: that call fails in time, and
    the one thread is not left blocked on it, so a read queued behind (a lease look-up) is served.
    (With a busy timeout longer than the call's, the read waited behind it and failed too.)"""
    path = tmp_path / "locked.db"
    store = SQLiteCheckpointStore(path, timeout_s=1.0)
    await store.connect()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's write, in progress
    try:
        write = asyncio.ensure_future(store.begin("d1", b"header"))
        await asyncio.sleep(0.05)  # the write is on the thread, waiting for the lock
        read = await store.get_lease("d1")  # queued behind it
        assert read is None
        with pytest.raises(TransportError):
            await write
    finally:
        holder.rollback()
        holder.close()
        await store.close()
