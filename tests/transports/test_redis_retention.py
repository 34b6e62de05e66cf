"""Redis streams are trimmed by age (``topic_retention_s``, 7 days unless told): every XADD of
debatebus (publish, the settle script's results and dead letters, pub/sub's dead letters) carries
``MINID ~ <now - retention>``, and a consumer trims the streams it reads with ``XTRIM``.

Entries written with ids from 1970 are older than any retention, so most tests need no waiting:
what they assert is that the old entries are gone (approximate trimming drops whole nodes of up to
100 entries, so a node's worth may stay) and that younger ones are kept. The last test runs 10,000
requests through a worker with a 2 s retention and bounds each stream's length.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from tests.support.servers import RedisServer
from tests.support.transports import Reader

from debatebus._worker import DebateBus
from debatebus.checkpoints import store_for_broker
from debatebus.exceptions import ConfigError
from debatebus.observability._heartbeat import latest_heartbeat
from debatebus.observability._observer import Observer, RequestContext, Settlement
from debatebus.transports import Delivery, transport_from_url
from debatebus.transports._base import Outgoing, dlq_topic
from debatebus.transports._redis_pubsub import RedisPubSubTransport
from debatebus.transports._redis_streams import RedisStreamsTransport

pytestmark = pytest.mark.redis

OLD = 300  # entries from 1970: three whole nodes of 100
NODE = 100  # stream-node-max-entries: approximate trimming keeps up to a node of older entries
REQUEST = b'{"requestId":"r-1","payload":{"input":"Tabs or spaces?"}}'
WAIT = 30.0


@pytest.fixture
def topic() -> str:
    return f"debate:{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


async def add_old(raw: Redis, stream: str, count: int = OLD, *, first_ms: int = 1) -> None:
    """``count`` entries with ids from ``first_ms`` on (ms since the epoch: 1970 by default)."""
    pipe = raw.pipeline(transaction=False)
    for n in range(count):
        pipe.xadd(stream, {"envelope": b"old %d" % n}, id=f"{first_ms + n}-0")
    await pipe.execute()


async def oldest_ms(raw: Redis, stream: str) -> int:
    ((entry_id, _),) = await raw.xrange(stream, "-", "+", count=1)
    return int(entry_id.split(b"-")[0])


async def test_publish_ack_and_reject_trim_what_is_older_than_the_retention(
        redis_server: RedisServer, topic: str, raw: Redis) -> None:
    completed, dlq = f"event:{topic}:completed", dlq_topic(topic)
    for stream in (topic, completed, dlq):
        await add_old(raw, stream)
    async with RedisStreamsTransport(redis_server.url, claim_idle_ms=300, block_ms=100) as t:
        await t.publish(Outgoing(topic, REQUEST))
        await t.publish(Outgoing(topic, b"not json"))
        reader = Reader(t.consume([topic], group="workers", consumer="w1"))
        answered, rejected = await reader.next(), await reader.next()
        await t.ack(answered, [Outgoing(completed, b'{"requestId":"r-1"}')])
        await t.reject(rejected, "cannot decode")
        reader.task.cancel()
    # The default retention (7 days) leaves no entry from 1970 but at most part of a node.
    for stream in (topic, completed, dlq):
        assert await raw.xlen(stream) <= NODE + 2, stream
    ((_, newest),) = await raw.xrevrange(completed, count=1)
    assert newest[b"envelope"] == b'{"requestId":"r-1"}'
    assert (await raw.xpending(topic, "workers"))["pending"] == 0


async def test_entries_younger_than_the_retention_are_kept(
        redis_server: RedisServer, topic: str, raw: Redis) -> None:
    six_days_ago = int(time.time() * 1000) - 6 * 86_400_000
    await add_old(raw, topic, first_ms=six_days_ago)
    async with RedisStreamsTransport(redis_server.url) as t:
        await t.publish(Outgoing(topic, REQUEST))
    assert await raw.xlen(topic) == OLD + 1
    assert await oldest_ms(raw, topic) == six_days_ago


async def test_topic_retention_from_the_url_and_never(
        redis_server: RedisServer, topic: str, raw: Redis) -> None:
    an_hour_ago = int(time.time() * 1000) - 3_600_000
    await add_old(raw, topic, first_ms=an_hour_ago)
    kept, given = f"{topic}:kept", f"{topic}:given"
    await add_old(raw, kept)
    await add_old(raw, given)
    async with transport_from_url(redis_server.url + "?topic_retention=10m") as t:
        await t.publish(Outgoing(topic, REQUEST))
    async with transport_from_url(redis_server.url + "?topic_retention=never") as t:
        await t.publish(Outgoing(kept, REQUEST))
    # A keyword argument wins over the URL's parameter, as on Kafka.
    async with transport_from_url(redis_server.url + "?topic_retention=10m",
                                  topic_retention_s=math.inf) as t:
        await t.publish(Outgoing(given, REQUEST))
    assert await raw.xlen(topic) <= NODE + 1  # an hour old: past a 10-minute retention
    assert await raw.xlen(kept) == OLD + 1  # never: nothing trimmed, even from 1970
    assert await raw.xlen(given) == OLD + 1


async def test_a_consumer_trims_requests_from_producers_that_never_trim(
        redis_server: RedisServer, topic: str, raw: Redis) -> None:
    """A plain XADD (another client, ``redis-cli``) trims nothing; the worker's XTRIM does, before
    it reads: entries older than the retention are gone even if no consumer ever read them."""
    await add_old(raw, topic)
    await raw.xadd(topic, {"envelope": REQUEST})
    async with RedisStreamsTransport(redis_server.url, claim_idle_ms=300, block_ms=100) as t:
        reader = Reader(t.consume([topic], group="workers", consumer="w1"))
        await reader.next()  # the consumer trims, then reads
        reader.task.cancel()
    assert await raw.xlen(topic) <= NODE + 1


async def test_pubsub_dead_letters_are_trimmed_too(
        redis_server: RedisServer, topic: str, raw: Redis) -> None:
    kept = f"{topic}:kept"
    await add_old(raw, dlq_topic(topic))
    await add_old(raw, dlq_topic(kept))
    async with RedisPubSubTransport(redis_server.url) as t:
        await t.reject(Delivery(topic, b"not json", ""), "cannot decode")
    async with transport_from_url(redis_server.url.replace("redis://", "redis+pubsub://")
                                  + "?topic_retention=never") as t:
        await t.reject(Delivery(kept, b"not json", ""), "cannot decode")
    assert await raw.xlen(dlq_topic(topic)) <= NODE + 1
    assert await raw.xlen(dlq_topic(kept)) == OLD + 1


async def test_bad_retentions_say_what_to_fix(redis_server: RedisServer) -> None:
    with pytest.raises(ConfigError, match="topic_retention_s must be a positive number"):
        RedisStreamsTransport(redis_server.url, topic_retention_s=0)
    with pytest.raises(ConfigError, match=r"at least 10 × claim_idle_ms"):
        RedisStreamsTransport(redis_server.url, topic_retention_s=60, claim_idle_ms=30_000)
    with pytest.raises(ConfigError, match=r"topic_retention='soon' in a URL"):
        transport_from_url(redis_server.url + "?topic_retention=soon")
    with pytest.raises(ConfigError, match="topic_retention_s must be a positive number"):
        RedisPubSubTransport(redis_server.url, topic_retention_s=-1)


async def test_every_client_of_the_bus_url_ignores_the_parameter(redis_server: RedisServer) -> None:
    """The bus URL also builds the default checkpoint store and ``debatebus check``'s client:
    redis-py would refuse an unknown parameter when connecting."""
    url = redis_server.url + "?topic_retention=2d"
    store = store_for_broker(url)
    assert store is not None
    async with store:
        assert await store.load("nothing-here") is None
    assert await latest_heartbeat(url, f"g-{uuid.uuid4().hex[:8]}") is None


class Finished(Observer):
    """Counts settled requests, and wakes a waiter at each."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = asyncio.Event()

    def request_finished(self, ctx: RequestContext, outcome: Settlement, result: Any,
                         duration_s: float) -> None:
        self.count += 1
        self.changed.set()

    async def reach(self, count: int) -> None:
        async with asyncio.timeout(WAIT):
            while self.count < count:
                await self.changed.wait()
                self.changed.clear()


@pytest.mark.slow
async def test_ten_thousand_requests_keep_every_stream_short(redis_server: RedisServer,
                                                             topic: str, raw: Redis) -> None:
    """10,000 requests in waves of 200, at most one wave every 0.2 s, with a 2 s retention: each
    stream holds what arrived in the last 2 s (at most 12 waves' worth, with a node of older
    entries), never everything. Each wave is answered before the next one (a request still
    unread when it ages past the retention would be trimmed unread)."""
    retention_s, wave_s, waves, size = 2.0, 0.2, 50, 200
    url = f"{redis_server.url}?topic_retention={retention_s:g}s"
    completed, failed, dlq = f"event:{topic}:completed", f"event:{topic}:failed", dlq_topic(topic)
    finished = Finished()
    app = DebateBus(url, group="workers", consumer="w1", concurrency=64, heartbeat_interval_s=None,
                    observers=[finished],
                    transport_options={"claim_idle_ms": 200, "block_ms": 50})

    async def handle(payload: dict[str, Any]) -> dict[str, Any]:
        return {"answer": len(str(payload))}

    app.subscribe(topic, handle)
    per_wave = {topic: size, completed: size * 8 // 10, failed: size // 10, dlq: size // 10}
    longest = dict.fromkeys(per_wave, 0)
    async with RedisStreamsTransport(url, claim_idle_ms=200) as producer, app:
        worker = asyncio.create_task(app.run())
        try:
            for wave in range(waves):
                started = time.monotonic()
                bodies = [b'{"requestId":"%d-%d","payload":{"input":"q"}}' % (wave, n)
                          for n in range(per_wave[completed])]
                bodies += [b'{"requestId":"%d-bad-%d","payload":7}' % (wave, n)
                           for n in range(per_wave[failed])]  # a failed result
                bodies += [b"\xff not json %d" % n for n in range(per_wave[dlq])]  # a dead letter
                await asyncio.gather(*(producer.publish(Outgoing(topic, b)) for b in bodies))
                await finished.reach((wave + 1) * size)
                for stream in per_wave:
                    longest[stream] = max(longest[stream], await raw.xlen(stream))
                await asyncio.sleep(max(0.0, wave_s - (time.monotonic() - started)))
        finally:
            app.stop()
            await asyncio.wait_for(worker, WAIT)
    assert finished.count == waves * size
    window = int(retention_s / wave_s) + 2  # waves that can be younger than the retention
    for stream, count in per_wave.items():
        assert longest[stream] <= window * count + NODE, (stream, longest[stream])
        assert longest[stream] < waves * count / 2, (stream, longest[stream])
