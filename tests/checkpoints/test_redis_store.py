"""Redis-only guarantees: restarts with AOF, error mapping, caller-owned clients, result TTL."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot
from tests.support.servers import RedisServer, free_port

from debatebus.checkpoints import Counters, RedisCheckpointStore
from debatebus.exceptions import ConfigError, TransportError

pytestmark = pytest.mark.redis


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A private redis-server this test may restart (the session's one is shared)."""
    server = RedisServer.start(appendonly=True)
    try:
        yield server
    finally:
        server.stop()


def _prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.mark.slow
async def test_survives_a_server_restart_with_aof(own_server: RedisServer) -> None:
    async with RedisCheckpointStore(own_server.url, prefix="p") as store:
        await store.begin("d1", b"h")
        await store.append("d1", b"e1", Counters(calls=1))
        await store.put_result("done", b"result")
        assert await store.acquire_lease("d1", "w1", 120) is True

        await asyncio.to_thread(own_server.restart)

        # The same client reconnects; the Lua scripts are reloaded into the fresh script cache.
        assert await store.append("d1", b"e2", Counters(calls=2)) == 2
        loaded = await store.load("d1")
        assert loaded is not None
        assert (loaded.header, loaded.entries, loaded.counters) == (
            b"h", [b"e1", b"e2"], Counters(calls=2))
        assert await store.get_result("done") == b"result"
        lease = await store.get_lease("d1")
        assert lease is not None
        assert lease.owner == "w1"
        assert await store.acquire_lease("d1", "w2", 120) is False
        assert await store.renew_lease("d1", "w1", 120) is True


async def test_a_burst_after_redis_forgot_the_scripts_loads_them_once(
        own_server: RedisServer) -> None:
    """After a Redis restart (here: SCRIPT FLUSH), 300 lease renewals at once all find their
    script missing: they load it once between them. (Each loading them took a pool
    connection of its own: the burst ran the pool dry and failed.) The other scripts are loaded
    when a command of theirs finds them missing."""
    raw = Redis.from_url(own_server.url)
    async with RedisCheckpointStore(own_server.url, prefix=_prefix()) as store:
        for i in range(300):
            assert await store.acquire_lease(f"d{i}", "w1", 120) is True
        await raw.script_flush()
        loads = await _script_loads(raw)
        renewed = await asyncio.gather(*(store.renew_lease(f"d{i}", "w1", 120)
                                         for i in range(300)))
        assert all(renewed)
        assert await _script_loads(raw) - loads == 1  # the renewal's script, once
    await raw.aclose()


async def test_what_a_worker_calls_for_each_debate_is_pipelined(own_server: RedisServer) -> None:
    """300 debates at once taking, releasing and reading (a drain releasing every lease; sub-
    debates reading their children's results): pipelined, not a pool connection each. (With
    one each, two thirds failed 'Too many connections', and a drain left those leases held.)"""
    ids = [f"d{i}" for i in range(300)]
    async with RedisCheckpointStore(own_server.url, prefix=_prefix()) as store:
        assert all(await asyncio.gather(*(store.acquire_lease(d, "w1", 120) for d in ids)))
        await asyncio.gather(*(store.begin(d, b"h") for d in ids))
        loaded = await asyncio.gather(*(store.load(d) for d in ids))
        assert all(c is not None and c.header == b"h" for c in loaded)
        assert await asyncio.gather(*(store.get_result(d) for d in ids)) == [None] * 300
        await asyncio.gather(*(store.release_lease(d, "w1") for d in ids))
        assert await asyncio.gather(*(store.get_lease(d) for d in ids[:50])) == [None] * 50


async def _script_loads(raw: Redis) -> int:
    stats = await raw.info("commandstats")
    return int(stats.get("cmdstat_script|load", {}).get("calls", 0))


async def test_unreachable_server_is_a_transport_error() -> None:
    store = RedisCheckpointStore(f"redis://127.0.0.1:{free_port()}/0", connect_timeout=0.5)
    with pytest.raises(TransportError, match="redis-server running"):
        await store.connect()
    with pytest.raises(TransportError):
        await store.load("d1")


async def test_a_client_that_decodes_is_refused(redis_server: RedisServer) -> None:
    client = Redis.from_url(redis_server.url, decode_responses=True)
    try:
        with pytest.raises(ConfigError, match="decode_responses"):
            RedisCheckpointStore(client)
    finally:
        await client.aclose()


async def test_a_given_client_stays_open(redis_url: str) -> None:
    client = Redis.from_url(redis_url)
    try:
        async with RedisCheckpointStore(client, prefix=_prefix()) as store:
            await store.put_result("d1", b"r")
        assert await client.ping() is True
    finally:
        await client.aclose()


async def test_key_layout(redis_url: str) -> None:
    prefix = _prefix()
    client = Redis.from_url(redis_url)
    try:
        async with RedisCheckpointStore(client, prefix=prefix) as store:
            await store.begin("d1", b"h")
            await store.append("d1", b"e1", Counters(1, 2, 3, 4))
            await store.acquire_lease("d1", "w1", 60)
            await store.append_many("d1", [b"e2", b"e3"], Counters(5, 6, 11, 7))
            # One list: the header, then tagged entries; the newest counters ride on the last one.
            assert await client.lrange(f"{prefix}:{{d1}}:ckpt", 0, -1) == [
                b"h", b"c1,2,3,4;e1", b"ee2", b"c5,6,11,7;e3"]
            assert await client.get(f"{prefix}:{{d1}}:lease") == b"w1"
            assert 0 < await client.pttl(f"{prefix}:{{d1}}:lease") <= 60_000
            await store.put_result("d1", b"r")
            assert await client.get(f"{prefix}:{{d1}}:result") == b"r"
            assert await client.get(f"{prefix}:{{d1}}:done") == b"1"
            assert await client.exists(f"{prefix}:{{d1}}:ckpt") == 0
            # Nothing else: every key of the store is one of a debate's four.
            assert sorted(await client.keys(f"{prefix}:*")) == [
                f"{prefix}:{{d1}}:{name}".encode() for name in ("done", "lease", "result")]
    finally:
        await client.aclose()


async def test_a_debates_keys_share_one_hash_slot(redis_server: RedisServer) -> None:
    """On a Redis Cluster the start/finish scripts touch all four keys: one slot, or CROSSSLOT."""
    prefix = _prefix()
    client = Redis.from_url(redis_server.url)
    try:
        async with RedisCheckpointStore(client, prefix=prefix) as store:
            for debate_id in ("d1", "a:b", "weird}id{", "é"):
                await store.start(debate_id, "w1", 60, b"h")
                keys = set(await client.keys(f"{prefix}:*"))  # checkpoint and lease
                await store.put_result(debate_id, b"r")
                keys |= set(await client.keys(f"{prefix}:*"))  # lease, result, finished marker
                assert len(keys) == 4, keys
                assert len({key_slot(key) for key in keys}) == 1, keys
                await client.delete(*keys)
    finally:
        await client.aclose()


async def test_every_write_sets_the_expiry_of_what_it_writes(redis_url: str) -> None:
    """Redis expires the keys itself: each carries its PTTL from the write that made it."""
    prefix, hour = _prefix(), 3600_000
    client = Redis.from_url(redis_url)

    async def pttl(debate_id: str, name: str) -> int:
        return int(await client.pttl(f"{prefix}:{{{debate_id}}}:{name}"))

    try:
        async with RedisCheckpointStore(client, prefix=prefix, retention_s=3600) as store:
            assert await pttl("d1", "ckpt") == -2  # no such key
            await store.start("d1", "w1", 30, b"h")
            assert hour - 5000 < await pttl("d1", "ckpt") <= hour
            assert 0 < await pttl("d1", "lease") <= 30_000  # leases keep their own TTL
            await store.append_many("d1", [b"e1"], Counters(), retention_s=7200)
            assert 2 * hour - 5000 < await pttl("d1", "ckpt") <= 2 * hour
            await store.finish("d1", "w1", b"r")
            assert hour - 5000 < await pttl("d1", "result") <= hour
            assert 2 * hour - 5000 < await pttl("d1", "done") <= 2 * hour
            await store.begin("d2", b"h", retention_s=60)
            assert 55_000 < await pttl("d2", "ckpt") <= 60_000
            await store.put_result("d2", b"r", retention_s=math.inf)  # kept forever
            assert await pttl("d2", "result") == -1
            assert await pttl("d2", "done") == -1
    finally:
        await client.aclose()


async def test_default_retention_is_seven_days(redis_url: str) -> None:
    prefix, week = _prefix(), 7 * 24 * 3600_000
    client = Redis.from_url(redis_url)
    try:
        async with RedisCheckpointStore(client, prefix=prefix) as store:
            await store.put_result("d1", b"r")
            assert week - 5000 < await client.pttl(f"{prefix}:{{d1}}:result") <= week
    finally:
        await client.aclose()


async def test_works_without_async_with(redis_url: str) -> None:
    store = RedisCheckpointStore(redis_url, prefix=_prefix())
    assert await store.begin("d1", b"h") == b"h"
    await store.close()
    await store.close()
