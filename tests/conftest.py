"""Session-wide fixtures: private brokers started once, and a guard against paid model calls."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import debatebus.llm
from tests.support.cluster import RedisClusterServers
from tests.support.servers import RedisServer, TansuServer

# No test may reach a paid provider: OpenAI/Anthropic clients refuse their public endpoints.
debatebus.llm.ALLOW_MODEL_REQUESTS = False


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tansu_server() -> Iterator[TansuServer]:
    server = TansuServer.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A 3-master Redis Cluster (tests/support/cluster.py), started once per session."""
    servers = RedisClusterServers.start()
    try:
        yield servers
    finally:
        servers.stop()
