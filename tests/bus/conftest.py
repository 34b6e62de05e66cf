"""Bus-level fixtures: a broker URL per transport kind and a fresh event type (the helpers are
tests/support/bus.py)."""

from __future__ import annotations

import uuid

import pytest

BUS_KINDS = ["memory", "redis_streams", "redis_pubsub", "kafka"]


@pytest.fixture(params=BUS_KINDS)
def bus_url(request: pytest.FixtureRequest) -> str:
    kind = request.param
    if kind == "memory":
        return "memory://"
    if kind == "kafka":
        return str(request.getfixturevalue("tansu_server").url)
    server = request.getfixturevalue("redis_server")
    return server.url if kind == "redis_streams" else server.url.replace("redis://", "redis+pubsub://")


@pytest.fixture
def event_type() -> str:
    return f"debate:request{uuid.uuid4().hex[:8]}"
