"""Session-wide fixtures: private brokers started once, and a guard against paid model calls.
Markers follow the brokers a test uses (tests/support/markers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import debatebus.llm
from tests.support import markers
from tests.support.cluster import RedisClusterServers
from tests.support.servers import RedisServer, TansuServer
from tests.support.transports import with_protocol

# No test may reach a paid provider: OpenAI/Anthropic clients refuse their public endpoints.
debatebus.llm.ALLOW_MODEL_REQUESTS = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        for name in sorted(markers.broker_markers(getattr(item, "fixturenames", ()), params)):
            item.add_marker(name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[object]:
    markers.running = {mark.name for mark in item.iter_markers()}
    try:
        return (yield)
    finally:
        markers.running = None


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


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def redis_url(request: pytest.FixtureRequest, redis_server: RedisServer) -> str:
    """The session's redis-server over RESP2, then over RESP3."""
    return with_protocol(redis_server.url, request.param)
