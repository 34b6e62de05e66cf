"""``redis_server_url``: the one rule naming the Redis server behind a broker URL, used by the
transports, the default checkpoint store, the eval command's limiter and the heartbeat reader."""

from __future__ import annotations

import pytest

from debatebus.checkpoints import RedisCheckpointStore, store_for_broker
from debatebus.transports import redis_server_url


@pytest.mark.parametrize(("broker", "server"), [
    ("redis://h:6379/2?cluster=true", "redis://h:6379/2?cluster=true"),
    ("rediss://:pw@h/0", "rediss://:pw@h/0"),
    ("redis+pubsub://h:6379/3?protocol=3", "redis://h:6379/3?protocol=3"),
    ("rediss+pubsub://:pw@h1,h2/0?cluster=true", "rediss://:pw@h1,h2/0?cluster=true"),
    ("kafka://h:9092", None),
    ("memory://", None),
    ("pubsub://h", None),
    ("valkey+pubsub://h", None),
])
def test_the_redis_server_behind_a_broker_url(broker: str, server: str | None) -> None:
    assert redis_server_url(broker) == server


async def test_a_pubsub_bus_keeps_its_checkpoints_on_the_same_server() -> None:
    store = store_for_broker("redis+pubsub://127.0.0.1:1/4")
    assert isinstance(store, RedisCheckpointStore)
    assert store._url == "redis://127.0.0.1:1/4"
