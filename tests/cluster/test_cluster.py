"""Redis Cluster specifics on a real 3-master cluster: the key layout, reads across slots, the
Synkro dialect's single-key claim, the rate limiter, an unreachable cluster, and a slot migrating
under a flow."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import time
import uuid
from typing import Any

import pytest
from redis.crc import key_slot
from tests.support.cluster import RedisClusterServers
from tests.support.llm import granted_now
from tests.support.servers import free_port
from tests.support.transports import Kind, Reader

from debatebus._redis import (
    ClusterBatcher,
    build_client,
    cluster_key,
    describe,
    seed_names,
    split_cluster,
    split_seeds,
)
from debatebus._redis.topology import ClusterMap
from debatebus.exceptions import ConfigError, TransportError
from debatebus.llm._ratelimit import RateLimit
from debatebus.llm._ratelimit_redis import RedisRateLimiter
from debatebus.observability._heartbeat import latest_heartbeat
from debatebus.schemas.envelope import completed_topic
from debatebus.transports import transport_from_url
from debatebus.transports._base import Delivery, Outgoing, dlq_topic
from debatebus.transports._redis_pubsub import RedisPubSubTransport
from debatebus.transports._redis_streams import RedisStreamsTransport
from debatebus.transports._synkro import dedupe_key, lock_key

pytestmark = pytest.mark.redis


def _topics_on_different_masters(cluster: RedisClusterServers) -> tuple[str, str]:
    first = f"test:{uuid.uuid4().hex[:8]}"
    while True:
        second = f"test:{uuid.uuid4().hex[:8]}"
        if cluster.owner(cluster_key(second)) != cluster.owner(cluster_key(first)):
            return first, second


async def _settle_all(transport: RedisStreamsTransport, reader: Reader, count: int,
                      timeout: float = 20.0) -> list[Delivery]:
    got = []
    for _ in range(count):
        delivery = await reader.next(timeout)
        await transport.ack(delivery, [Outgoing(completed_topic(delivery.topic), delivery.body)])
        got.append(delivery)
    return got


async def test_a_family_lives_in_one_slot_and_round_trips(redis_cluster: RedisClusterServers) -> None:
    topic = f"debate:{uuid.uuid4().hex[:8]}"
    async with RedisStreamsTransport(redis_cluster.url, claim_idle_ms=500, block_ms=100) as t:
        results = Reader(await t.subscribe([completed_topic(topic)]))
        consumer = Reader(t.consume([topic], group="g", consumer="c1"))
        await t.publish(Outgoing(topic, b'{"requestId":"r1"}'))
        await t.publish(Outgoing(topic, b'{"requestId":"r2"}'))
        first = await consumer.next()
        await t.ack(first, [Outgoing(completed_topic(topic), b'{"done":1}')])
        second = await consumer.next()
        await t.reject(second, "bad")
        answer = await results.next()
        consumer.stop()
        results.stop()
    assert (first.topic, answer.topic, answer.body) == (topic, completed_topic(topic), b'{"done":1}')
    keys = {topic: f"{{{topic}}}", completed_topic(topic): f"event:{{{topic}}}:completed",
            dlq_topic(topic): f"{{{topic}}}:dlq"}
    sync = redis_cluster.client()
    assert {name: sync.exists(key) for name, key in keys.items()} == dict.fromkeys(keys, 1)
    assert len({key_slot(key.encode()) for key in keys.values()}) == 1
    assert not sync.exists(topic), "the bare topic name is single-node Redis's key, not a cluster's"
    [(_, fields)] = sync.xrange(keys[dlq_topic(topic)])
    assert fields[b"reason"] == b"bad" and fields[b"origin"] == topic.encode()


async def test_consume_and_subscribe_across_masters(redis_cluster: RedisClusterServers) -> None:
    a, b = _topics_on_different_masters(redis_cluster)
    async with RedisStreamsTransport(redis_cluster.url, claim_idle_ms=500, block_ms=100) as t:
        follower = Reader(await t.subscribe([completed_topic(a), completed_topic(b)]))
        consumer = Reader(t.consume([a, b], group="g", consumer="c1"))
        for n in range(3):
            await t.publish(Outgoing(a, b"a%d" % n))
            await t.publish(Outgoing(b, b"b%d" % n))
        got = await _settle_all(t, consumer, 6)
        followed = [await follower.next() for _ in range(6)]
        consumer.stop()
        follower.stop()
    assert sorted(d.body for d in got) == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]
    assert {d.topic for d in followed} == {completed_topic(a), completed_topic(b)}


async def test_what_a_slot_read_got_after_consume_ended_is_let_go(
        redis_cluster: RedisClusterServers) -> None:
    """A per-slot read still running when the consumer stops taking deliveries reads an entry;
    once that consume ends, the entry is not held (kept alive) forever: it is reclaimed."""
    a, b = _topics_on_different_masters(redis_cluster)
    sync = redis_cluster.client()
    async with RedisStreamsTransport(redis_cluster.url, claim_idle_ms=300, block_ms=2000) as t:
        await t.publish(Outgoing(a, b"a"))
        stream = t.consume([a, b], group="g", consumer="c1")
        first = await asyncio.wait_for(anext(stream), 10)  # a's read answered, b's still blocks
        await t.publish(Outgoing(b, b"b"))
        async with asyncio.timeout(10):  # b's read takes it while nobody iterates the stream
            while sync.xpending(cluster_key(b), "g")["pending"] == 0:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # and its reply is in
        await stream.aclose()
        await t.ack(first)
        again = t.consume([a, b], group="g", consumer="c1")
        got = await asyncio.wait_for(anext(again), 10)
        await t.ack(got)
        await again.aclose()
    assert (first.body, got.body, got.deliveries) == (b"a", b"b", 2)


async def test_a_result_outside_the_family_is_refused_not_retried(
        redis_cluster: RedisClusterServers) -> None:
    a, b = _topics_on_different_masters(redis_cluster)
    async with RedisStreamsTransport(redis_cluster.url, claim_idle_ms=500, block_ms=100) as t:
        consumer = Reader(t.consume([a], group="g", consumer="c1"))
        await t.publish(Outgoing(a, b"x"))
        delivery = await consumer.next()
        with pytest.raises(ConfigError, match="one family") as refused:
            await t.ack(delivery, [Outgoing(completed_topic(b), b"elsewhere")])
        await t.ack(delivery, [Outgoing(completed_topic(a), b"here")])  # still held: settles
        consumer.stop()
    assert cluster_key(completed_topic(b)) in str(refused.value)
    sync = redis_cluster.client()
    assert not sync.exists(cluster_key(completed_topic(b)))
    assert [f[b"envelope"] for _, f in sync.xrange(cluster_key(completed_topic(a)))] == [b"here"]


async def test_synkro_claim_is_exclusive_and_dedupes_on_a_cluster(
        redis_cluster: RedisClusterServers) -> None:
    topic = f"debate:{uuid.uuid4().hex[:8]}"
    url = redis_cluster.url.replace("redis://", "redis+pubsub://")
    async with transport_from_url(url) as one, transport_from_url(url) as two:
        assert isinstance(one, RedisPubSubTransport) and isinstance(two, RedisPubSubTransport)
        listener = Reader(await one.subscribe([completed_topic(topic)]))
        await listener.started(Kind("redis_pubsub", lambda: one), one, completed_topic(topic))
        await listener.drain_probes()
        delivery = Delivery(topic, b'{"requestId":"r-1","payload":{}}', "", 1, None, {}, None)
        claims = await asyncio.gather(one.dialect.claim(delivery, "r-1"),
                                      two.dialect.claim(delivery, "r-1"))
        assert sorted(claims) == [False, True]
        winner = one if claims[0] else two
        await winner.ack(delivery, [Outgoing(completed_topic(topic), b'{"requestId":"r-1"}')])
        assert (await listener.next()).body == b'{"requestId":"r-1"}'
        again = await asyncio.gather(one.dialect.claim(delivery, "r-1"),
                                     two.dialect.claim(delivery, "r-1"))
        listener.stop()
    sync = redis_cluster.client()
    assert again == [False, False], "answered already: the dedupe key says so"
    assert sync.get(dedupe_key("r-1", topic)) == b"1"
    assert not sync.exists(lock_key("r-1", topic)), "the lock is let go once settled"
    assert sync.get(f"synkro:metrics:{topic}:received") == b"1"


async def test_an_unreachable_cluster_raises_transport_error() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0?cluster=true"
    with pytest.raises(TransportError, match="cluster"):
        async with RedisStreamsTransport(url, connect_timeout=1.0) as t:
            await t.publish(Outgoing("x:y", b"z"))


async def test_a_slot_migrating_under_a_flow_loses_and_repeats_nothing(
        redis_cluster: RedisClusterServers) -> None:
    """Requests published and settled (with a result each) while their family's slot moves
    to another master: MOVED/ASK are followed, every request is answered exactly once."""
    topic = f"debate:{uuid.uuid4().hex[:8]}"
    key = cluster_key(topic)
    slot, source = key_slot(key.encode()), redis_cluster.owner(key)
    target = next(port for port in redis_cluster.ports if port != source)
    total = 300
    async with RedisStreamsTransport(redis_cluster.url, claim_idle_ms=1000, block_ms=100) as t:
        consumer = Reader(t.consume([topic], group="g", consumer="c1"))
        await t.publish(Outgoing(topic, b"warm-up"))
        settled = await _settle_all(t, consumer, 1)

        async def produce() -> None:
            for n in range(total):
                await t.publish(Outgoing(topic, b"%d" % n))
                await asyncio.sleep(0.002)

        producing = asyncio.create_task(produce())
        await asyncio.sleep(0.2)
        await asyncio.to_thread(redis_cluster.migrate_slot, slot, source, target)
        settled += await _settle_all(t, consumer, total)
        await producing
        consumer.stop()
    assert redis_cluster.owner(key) == target
    sync = redis_cluster.client()
    answers = [fields[b"envelope"] for _, fields in sync.xrange(cluster_key(completed_topic(topic)))]
    assert sorted(answers) == sorted([b"warm-up", *(b"%d" % n for n in range(total))])
    assert sync.xpending(key, "g")["pending"] == 0


async def test_rate_limiters_share_one_bucket_on_a_cluster(
        redis_cluster: RedisClusterServers) -> None:
    name = f"shared-{uuid.uuid4().hex[:8]}"
    limit = RateLimit(requests_per_minute=3, max_concurrent=2, period_s=60.0)
    one, two = (RedisRateLimiter(redis_cluster.url, name, limit) for _ in range(2))
    try:
        held = [await one.acquire(), await two.acquire()]
        assert not await granted_now(two)  # both slots held, one per client
        await one.release(held[0])
        assert await granted_now(two)  # the minute's 3rd request
        await two.release(held[1])
        assert not await granted_now(one)  # slots free, the minute's requests gone
    finally:
        await one.close()
        await two.close()
    assert redis_cluster.client().exists(*one.keys) == 2


@pytest.mark.parametrize(("topic", "key"), [
    ("debate:request", "{debate:request}"),
    ("event:debate:request:completed", "event:{debate:request}:completed"),
    ("event:debate:request:failed", "event:{debate:request}:failed"),
    ("debate:request:dlq", "{debate:request}:dlq"),
    ("event:debate:request:completed:dlq", "event:{debate:request}:completed:dlq"),
    ("event:event:debate:request:completed:completed",
     "event:event:{debate:request}:completed:completed"),
    ("event:workflow:flow:debate:request:completed", "event:{workflow:flow:debate:request}:completed"),
    ("orders:{eu}:new", "orders:{eu}:new"),
    ("event:orders:{eu}:new:completed", "event:orders:{eu}:new:completed"),
    ("odd{}name", "{odd{}name}"),  # an empty {} is no tag to Redis
])
def test_the_cluster_key_rule(topic: str, key: str) -> None:
    assert cluster_key(topic) == key


def test_the_cluster_url_parameter() -> None:
    assert split_cluster("redis://:secret@h:7000/0?cluster=true&protocol=3") == (
        "redis://:secret@h:7000/0?protocol=3", True)
    assert split_cluster("redis://h:7000/0?cluster=false") == ("redis://h:7000/0", False)
    assert split_cluster("redis://h:7000/0") == ("redis://h:7000/0", False)
    with pytest.raises(ConfigError, match="cluster= takes true or false") as refused:
        split_cluster("redis://:secret@h:7000/0?cluster=maybe")
    assert "secret" not in str(refused.value)
    assert describe("rediss://:secret@h:7000/0?cluster=true") == "h:7000 (cluster)"


def test_a_cluster_url_names_several_seeds() -> None:
    assert split_seeds("redis://:secret@h1:7000,h2:7001,[::1]/0?cluster=true") == (
        "redis://:secret@h1:7000/0?cluster=true", [("h1", 7000), ("h2", 7001), ("::1", 6379)])
    assert split_seeds("rediss://h1,:7001") == ("rediss://h1", [("h1", 6379), ("localhost", 7001)])
    assert split_seeds("unix:///tmp/redis.sock") == ("unix:///tmp/redis.sock", [])
    assert split_seeds("redis://h1:7000,h2?protocol=3") == (
        "redis://h1:7000?protocol=3", [("h1", 7000), ("h2", 6379)])
    assert describe("redis://:secret@h1:7000,h2/0?cluster=true") == "h1:7000,h2:6379 (cluster)"
    for url, why in [("redis://:secret@h1:7000,h2:x/0?cluster=true", "seed 'h2:x'"),
                     ("redis://:secret@h1:7000,h2:7001/0", "add \\?cluster=true")]:
        with pytest.raises(ConfigError, match=why) as refused:
            build_client(url, connect_timeout=1.0)
        assert "secret" not in str(refused.value)
    with pytest.raises(ConfigError, match="bad broker URL") as refused:
        transport_from_url("redis://:secret@h1:7000,h2:99999/0?cluster=true")
    assert "secret" not in str(refused.value)


async def test_a_dead_first_seed_is_passed_over(redis_cluster: RedisClusterServers) -> None:
    """The first seed does not answer (no server on its port): the next one is asked, and the
    worker's path (streams, store) runs on the cluster it describes."""
    live = redis_cluster.url.split("//", 1)[1].split("/", 1)[0]
    url = f"redis://127.0.0.1:{free_port()},{live}/0?cluster=true"
    topic = f"debate:{uuid.uuid4().hex[:8]}"
    async with RedisStreamsTransport(url, claim_idle_ms=500, block_ms=100) as t:
        consumer = Reader(t.consume([topic], group="g", consumer="c1"))
        await t.publish(Outgoing(topic, b'{"requestId":"r1"}'))
        [delivery] = await _settle_all(t, consumer, 1)
        consumer.stop()
    assert delivery.body == b'{"requestId":"r1"}'
    sync = redis_cluster.client()
    assert sync.xlen(f"event:{{{topic}}}:completed") == 1
    assert sync.xpending(cluster_key(topic), "g")["pending"] == 0


class _HeldRead(ClusterMap):
    """A slot map whose reads, once ``hold`` is set, answer only when it opens: what was true
    when they began."""

    hold: asyncio.Event | None = None

    async def read(self) -> Any:
        slots = await super().read()
        if self.hold is not None:
            await self.hold.wait()
        return slots


class _HeldMap(ClusterBatcher):
    Map = _HeldRead


def _rejected_gets(cluster: RedisClusterServers, port: int) -> int:
    stats = cluster.node(port).info("commandstats").get("cmdstat_get", {})
    return int(stats.get("rejected_calls", 0))


async def test_a_moved_heard_while_the_map_is_read_is_not_undone_by_it(
        redis_cluster: RedisClusterServers) -> None:
    """Slot s1 moves: its MOVED starts a map read, which answers late with what was true before
    s2 moved too. The MOVED for s2, heard meanwhile, wins: the next GET goes straight to s2's
    new master, not to the old one for another redirect."""
    first = f"k:{uuid.uuid4().hex[:8]}"
    source = redis_cluster.owner(first)
    second = next(k for k in (f"k:{uuid.uuid4().hex[:8]}" for _ in range(10_000))
                  if redis_cluster.owner(k) == source and key_slot(k.encode()) != key_slot(first.encode()))
    target = next(port for port in redis_cluster.ports if port != source)
    batcher = _HeldMap(build_client(redis_cluster.url, connect_timeout=2.0), "test", timeout=5.0)
    batcher.start()
    try:
        assert await batcher.submit((("SET", first, "1"), ("SET", second, "2"))) == [b"OK"] * 2
        hold = batcher._map.hold = asyncio.Event()  # type: ignore[attr-defined]
        await asyncio.to_thread(redis_cluster.migrate_slot, key_slot(first.encode()), source, target)
        assert await batcher.submit((("GET", first),)) == [b"1"]  # MOVED: a map read begins
        await asyncio.to_thread(redis_cluster.migrate_slot, key_slot(second.encode()), source, target)
        assert await batcher.submit((("GET", second),)) == [b"2"]  # MOVED during the read
        hold.set()
        await asyncio.sleep(0.2)  # the held read answers, with second's old master
        before = _rejected_gets(redis_cluster, source)
        assert before > 0, "a MOVED counts as a rejected call"
        assert await batcher.submit((("GET", second),)) == [b"2"]
        assert _rejected_gets(redis_cluster, source) == before
    finally:
        await batcher.stop()


class _StaleRead(ClusterMap):
    """A slot map whose first read is from before a failover it missed: every slot on a
    master that is gone, whose replica is gone too (nothing listens on their ports)."""

    gone: tuple[str, ...] = ()  # set by the test to ports bound but not listening
    reads = 0

    async def read(self) -> Any:
        found = await super().read()
        self.reads += 1
        if self.reads == 1:
            found.owners = [self.gone[0]] * len(found.owners)
            found.masters, found.nodes = {self.gone[0]}, list(self.gone)
        return found


class _StaleFirst(ClusterBatcher):
    Map = _StaleRead


async def test_commands_a_dead_master_could_not_take_go_where_the_seeds_say(
        redis_cluster: RedisClusterServers) -> None:
    """No connection to the master of the map can be opened (refused: a builtin OSError), nor
    to any node the map names: the commands, never sent, wait while the map is read again from
    the URL's seeds, then go to the live masters; the dead nodes are forgotten."""
    url = redis_cluster.url
    # Ports held bound but not listening refuse connections, and no other test's server can
    # take them meanwhile (a port merely found free could be, and then take the commands).
    held = [socket.socket(), socket.socket()]
    for sock in held:
        sock.bind(("127.0.0.1", 0))
    _StaleRead.gone = tuple(f"127.0.0.1:{sock.getsockname()[1]}" for sock in held)
    client = build_client(url, connect_timeout=1.0)  # never initialized: it knows no node
    batcher = _StaleFirst(client, "test", timeout=5.0, seeds=seed_names(url))
    batcher.start()
    keys = [f"k:{uuid.uuid4().hex[:8]}" for _ in range(3)]
    try:
        assert await batcher.submit([("SET", key, key) for key in keys]) == [b"OK"] * 3
        stale = batcher._map
        assert isinstance(stale, _StaleRead)
        assert stale.reads >= 2
        assert await batcher.submit([("GET", key) for key in keys]) == [k.encode() for k in keys]
        assert not set(stale.gone) & set(batcher._nodes), "the dead nodes are forgotten"
    finally:
        await batcher.stop()
        await client.aclose()
        for sock in held:
            sock.close()


async def test_a_job_whose_commands_all_fail_leaves_no_error_unread(
        redis_cluster: RedisClusterServers) -> None:
    """The first failed command fails the job; the others' errors are read all the same, so
    asyncio never logs "Future exception was never retrieved"."""
    loop = asyncio.get_running_loop()
    unhandled: list[str] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(str(context.get("message"))))
    lists = [f"l:{uuid.uuid4().hex[:8]}" for _ in range(4)]
    client = build_client(redis_cluster.url, connect_timeout=1.0)
    batcher = ClusterBatcher(client, "test", timeout=5.0)
    batcher.start()
    try:
        await batcher.submit([("RPUSH", key, "x") for key in lists])
        with pytest.raises(TransportError, match="WRONGTYPE"):
            await batcher.submit([("INCR", key) for key in lists])
    finally:
        await batcher.stop()
        await client.aclose()
        gc.collect()  # an error nobody read is reported when its future is collected
        loop.set_exception_handler(None)
    assert [m for m in unhandled if "never retrieved" in m] == []


@pytest.mark.parametrize("scheme", ["redis://", "redis+pubsub://"])
async def test_debatebus_check_finds_a_workers_heartbeat_on_a_cluster(
        redis_cluster: RedisClusterServers, scheme: str) -> None:
    """A worker's beats (a stream entry, or pub/sub's keys), written and read back through the
    slot map of the cluster; a last beat takes a pub/sub worker's out at once."""
    url, group = redis_cluster.url.replace("redis://", scheme), f"g-{uuid.uuid4().hex[:8]}"
    beat = json.dumps({"group": group, "consumer": "c", "timestamp": time.time()}).encode()
    async with transport_from_url(url) as t:
        await t.write_heartbeat(group, "c", beat, interval_s=5.0)
        assert (await latest_heartbeat(url, group) or {}).get("consumer") == "c"
        assert (await latest_heartbeat(url, group, "c") or {}).get("consumer") == "c"
        if scheme == "redis+pubsub://":
            await t.write_heartbeat(group, "c", beat, interval_s=5.0, last=True)
            assert await latest_heartbeat(url, group) is None
