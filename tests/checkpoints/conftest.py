"""One backend per checkpoint store (Redis also on a cluster); the contract suite runs against
each of them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from tests.support.checkpoints import Backend
from tests.support.transports import with_protocol

from debatebus.checkpoints import (
    CheckpointStore,
    MemoryCheckpointStore,
    RedisCheckpointStore,
    SQLiteCheckpointStore,
)

#: Redis twice: over RESP2 and RESP3 (``?protocol=3``), whose replies redis-py shapes differently.
#: Then over the session's 3-master Redis Cluster.
KINDS = ["memory", "sqlite", "redis-resp2", "redis-resp3", "redis-cluster"]


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
        url = with_protocol(request.getfixturevalue("redis_server").url, protocol)
        # A fresh prefix per test: the session's redis-server is shared by every test.
        prefix = f"test-{uuid.uuid4().hex[:12]}"
        return Backend("redis", lambda: RedisCheckpointStore(url, prefix=prefix), durable=True,
                       retained=lambda s: RedisCheckpointStore(url, prefix=prefix, retention_s=s))
    return make


def _redis_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    url, prefix = request.getfixturevalue("redis_cluster").url, f"test-{uuid.uuid4().hex[:12]}"
    return Backend("redis", lambda: RedisCheckpointStore(url, prefix=prefix), durable=True,
                   retained=lambda s: RedisCheckpointStore(url, prefix=prefix, retention_s=s))


_MAKERS = {"memory": _memory, "sqlite": _sqlite, "redis-resp2": _redis(2), "redis-resp3": _redis(3),
           "redis-cluster": _redis_cluster}


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
