"""Operator-style fault tests' fixtures: private brokers a test may kill, and worker subprocesses
(the counting helpers are tests/support/faults.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from tests.support.processes import WorkerProcess
from tests.support.servers import RedisServer, TansuServer


@pytest.fixture
def fault_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own (AOF, fsync always) that it may kill, pause or restart."""
    server = RedisServer.start(appendfsync="always")
    yield server
    server.stop()


@pytest.fixture
def fault_tansu() -> Iterator[TansuServer]:
    server = TansuServer.start()
    yield server
    server.stop()


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.stop()


@pytest.fixture
def event_type() -> str:
    return f"debate:req{uuid.uuid4().hex[:6]}"
