"""One backend per checkpoint store; the contract suite runs against each of them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.transports.conftest import redis_url, with_protocol

from debatebus.checkpoints import CheckpointStore, MemoryCheckpointStore, SQLiteCheckpointStore

#: Redis twice: over RESP2 and RESP3 (``?protocol=3``), whose replies redis-py shapes differently.
KINDS = ["memory", "sqlite", pytest.param("redis-resp2", marks=pytest.mark.redis),
         pytest.param("redis-resp3", marks=pytest.mark.redis)]


@dataclass
class Backend:
    """Where a store keeps its data. ``make()`` opens another store on the same data, as a second
    worker would (the memory backend can only hand back the same instance); ``retained(s)`` opens
    a store on the same data whose own retention is ``s`` seconds (memory: a store of its own)."""

    name: str
    make: Callable[[], CheckpointStore]
    durable: bool  # a new store instance sees what an earlier one wrote
    retained: Callable[[float], CheckpointStore]


def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    shared = MemoryCheckpointStore()
    return Backend("memory", lambda: shared, durable=False,
                   retained=lambda s: MemoryCheckpointStore(retention_s=s))


def _sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    path = tmp_path / "checkpoints.db"
    return Backend("sqlite", lambda: SQLiteCheckpointStore(path), durable=True,
                   retained=lambda s: SQLiteCheckpointStore(path, retention_s=s))


def _redis(protocol: int) -> Callable[[pytest.FixtureRequest, Path], Backend]:
    def make(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
        from debatebus.checkpoints import RedisCheckpointStore

        url = with_protocol(request.getfixturevalue("redis_server").url, protocol)
        # A fresh prefix per test: the session's redis-server is shared by every test.
        prefix = f"test-{uuid.uuid4().hex[:12]}"
        return Backend("redis", lambda: RedisCheckpointStore(url, prefix=prefix), durable=True,
                       retained=lambda s: RedisCheckpointStore(url, prefix=prefix, retention_s=s))
    return make


_MAKERS = {"memory": _memory, "sqlite": _sqlite, "redis-resp2": _redis(2), "redis-resp3": _redis(3)}


__all__ = ["redis_url"]  # the fixture, shared with the transport tests


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return _MAKERS[request.param](request, tmp_path)


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[CheckpointStore]:
    async with backend.make() as s:
        yield s


@pytest.fixture
async def peer(backend: Backend, store: CheckpointStore) -> AsyncIterator[CheckpointStore]:
    """A second worker's store on the same data."""
    other = backend.make()
    if other is store:
        yield store
        return
    async with other:
        yield other
