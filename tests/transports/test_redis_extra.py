"""Redis-only guarantees beyond the contract suite, on a private redis-server.

Clients the project did not write (``redis-cli``, plain redis-py) read and write our wire format;
a dead consumer's message is taken over with its real delivery count; ack publishes and
acknowledges in one script, only while the entry is pending (a connection cut before or after it
ran, then a retry: one result, no pending entry; two consumers acking one reclaimed entry: one
result); concurrent acks are batched and all land; Synkro's pub/sub wire round-trips; broker
failures surface as TransportError only. No test asserts on timing: every wait has a generous
deadline. Outages, dropped connections and frozen servers: ``test_redis_faults.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import MaxConnectionsError, RedisError
from tests.support.servers import RedisServer, free_port
from tests.support.transports import Reader

from debatebus._redis import transport_error
from debatebus.exceptions import TransportError
from debatebus.transports import transport_from_url
from debatebus.transports._base import Delivery, Outgoing, dlq_topic
from debatebus.transports._redis_groups import seat_of
from debatebus.transports._redis_pubsub import RedisPubSubTransport
from debatebus.transports._redis_streams import RedisStreamsTransport

pytestmark = [
    pytest.mark.redis,
    pytest.mark.skipif(shutil.which("redis-cli") is None, reason="needs redis-cli"),
]

TIMEOUT = 15.0
REQUEST = b'{"requestId":"r-1","payload":{"input":"Should we adopt microservices?"}}'


@pytest.fixture
def topic() -> str:
    return f"debate:{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[Redis]:
    """Plain redis-py, to look at what our transport left in Redis."""
    client = Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest.fixture
async def streams(redis_server: RedisServer) -> AsyncIterator[RedisStreamsTransport]:
    async with RedisStreamsTransport(redis_server.url, claim_idle_ms=300, block_ms=100) as t:
        yield t


async def cli(server: RedisServer, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        "redis-cli", "-p", str(server.port), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode == 0, err.decode()
    return out.decode()


# -- (1) a client the project did not write --------------------------------------------------

async def test_redis_cli_request_is_answered_and_the_result_read_back_by_redis_cli(
        redis_server: RedisServer, streams: RedisStreamsTransport, topic: str) -> None:
    results = f"event:{topic}:completed"
    await cli(redis_server, "XADD", topic, "*", "envelope", REQUEST.decode())
    got = await Reader(streams.consume([topic], group="workers", consumer="w1")).next()
    assert got.body == REQUEST
    assert got.deliveries == 1
    await streams.ack(got, [Outgoing(results, b'{"requestId":"r-1","debateStatus":"completed"}',
                                     key="r-1", headers={"content-type": "application/json"})])
    lines = (await cli(redis_server, "XRANGE", results, "-", "+")).splitlines()
    assert lines[1:] == ["envelope", '{"requestId":"r-1","debateStatus":"completed"}',
                         "key", "r-1", "headers", '{"content-type":"application/json"}']
    assert (await cli(redis_server, "XPENDING", topic, "workers")).splitlines()[0] == "0"


async def test_dead_letter_fields_as_redis_cli_sees_them(
        redis_server: RedisServer, streams: RedisStreamsTransport, topic: str) -> None:
    await cli(redis_server, "XADD", topic, "*", "envelope", "not json at all")
    got = await Reader(streams.consume([topic], group="workers", consumer="w1")).next()
    await streams.reject(got, "the body is not JSON: send a JSON envelope")
    fields = (await cli(redis_server, "XRANGE", dlq_topic(topic), "-", "+")).splitlines()[1:]
    assert dict(zip(fields[::2], fields[1::2], strict=True)) == {
        "envelope": "not json at all", "reason": "the body is not JSON: send a JSON envelope",
        "origin": topic, "originId": got.id, "deliveries": "1"}
    (dead,) = [d async for d in streams.read_range(dlq_topic(topic))]
    assert dead.body == b"not json at all"
    assert dead.headers == {"x-debatebus-reason": "the body is not JSON: send a JSON envelope",
                            "x-debatebus-origin": topic, "x-debatebus-origin-id": got.id,
                            "x-debatebus-deliveries": "1"}
    assert (await cli(redis_server, "XPENDING", topic, "workers")).splitlines()[0] == "0"


async def test_foreign_entries_are_delivered_not_crashed_on(
        redis_server: RedisServer, streams: RedisStreamsTransport, topic: str, raw: Redis) -> None:
    await raw.xadd(topic, {"envelope": b"\xff\xfe binary"})
    await raw.xadd(topic, {"data": "no envelope field"})
    await raw.xadd(topic, {"envelope": b"{}", "headers": b"[not an object"})
    reader = Reader(streams.consume([topic], group="workers", consumer="w1"))
    binary, missing, bad_headers = [await reader.next() for _ in range(3)]
    assert binary.body == b"\xff\xfe binary"
    assert missing.body == b'{"data":"no envelope field"}'  # every field, for the failure event
    assert missing.malformed is not None
    assert missing.malformed.startswith("stream entry has fields ['data'], expected 'envelope'")
    assert binary.malformed is None and bad_headers.malformed is None
    assert bad_headers.body == b"{}"
    assert bad_headers.headers == {"x-debatebus-bad-headers": "[not an object"}
    for delivery in (binary, missing, bad_headers):
        await streams.ack(delivery)


# -- (2) reclaim from a dead consumer ------------------------------------------------------------

async def test_dead_consumers_message_is_reclaimed_with_its_delivery_count(
        redis_server: RedisServer, streams: RedisStreamsTransport, topic: str, raw: Redis) -> None:
    await cli(redis_server, "XGROUP", "CREATE", topic, "workers", "0", "MKSTREAM")
    await cli(redis_server, "XADD", topic, "*", "envelope", REQUEST.decode())
    # A worker that reads and then dies: the entry sits in its pending list.
    assert REQUEST.decode() in await cli(redis_server, "XREADGROUP", "GROUP", "workers", "dead",
                                         "COUNT", "1", "STREAMS", topic, ">")
    got = await Reader(streams.consume([topic], group="workers", consumer="alive")).next()
    assert got.body == REQUEST
    assert got.deliveries == 2
    (pending,) = await raw.xpending_range(topic, "workers", "-", "+", 10)
    assert pending["consumer"] == b"alive"
    await streams.ack(got)
    assert (await raw.xpending(topic, "workers"))["pending"] == 0


async def test_requeued_message_comes_back_counted(streams: RedisStreamsTransport,
                                                   topic: str) -> None:
    await streams.publish(Outgoing(topic, REQUEST))
    reader = Reader(streams.consume([topic], group="workers", consumer="w1"))
    first = await reader.next()
    await streams.reject(first, "busy", requeue=True)
    again = await reader.next()
    assert (again.id, again.deliveries) == (first.id, 2)
    await streams.ack(again)


async def test_200_requeues_at_once_all_land_and_come_back_counted(
        streams: RedisStreamsTransport, topic: str) -> None:
    """A handler failing for every request in flight requeues them all at once: pipelined, not
    a pool connection each (more than its 100 failed)."""
    n = 200
    for i in range(n):
        await streams.publish(Outgoing(topic, b'{"n":%d}' % i))
    reader = Reader(streams.consume([topic], group="workers", consumer="w1", prefetch=n))
    first = [await reader.next() for _ in range(n)]
    await asyncio.gather(*(streams.reject(d, "handler raised", requeue=True) for d in first))
    again = [await reader.next() for _ in range(n)]
    assert sorted((d.id, d.deliveries) for d in again) == sorted((d.id, 2) for d in first)
    await asyncio.gather(*(streams.ack(d) for d in again))


async def test_a_live_consumers_long_work_is_not_taken_over(redis_server: RedisServer,
                                                             topic: str, raw: Redis) -> None:
    """The holder refreshes its entries every claim_idle_ms/3, so another consumer never takes
    them over. The positive signal that the other consumer did look: an entry of a consumer that
    died, published after the held one, which it takes over (claims go in entry order, so the
    held entry, idle longer, would come first if its holder had let it go idle)."""
    url = redis_server.url
    async with RedisStreamsTransport(url, claim_idle_ms=1500, block_ms=100) as holder, \
            RedisStreamsTransport(url, claim_idle_ms=1500, block_ms=100) as other:
        await holder.publish(Outgoing(topic, REQUEST))
        # Pulled once, not pumped: the holder reads nothing more, the orphan is the dying one's.
        holding = holder.consume([topic], group="workers", consumer="holder")
        held = await asyncio.wait_for(anext(holding), 15)
        await holder.publish(Outgoing(topic, b'{"orphan":true}'))
        async with RedisStreamsTransport(url, claim_idle_ms=1500, block_ms=100) as dying:
            orphan = await Reader(dying.consume([topic], group="workers", consumer="dies")).next()
        taken = await Reader(other.consume([topic], group="workers", consumer="other")).next()
        assert (taken.id, taken.deliveries) == (orphan.id, 2)
        await other.ack(taken)
        await holder.ack(held)
        await holding.aclose()
    assert (await raw.xpending(topic, "workers"))["pending"] == 0


# -- (3) atomic, batched acks ----------------------------------------------------------------

async def test_concurrent_acks_are_batched_and_all_land(redis_server: RedisServer, topic: str,
                                                        raw: Redis) -> None:
    n, results = 200, f"event:{topic}:completed"
    # Nothing else reads while the acks are counted: the reader stops first, and the keep-alive
    # of what it handed out runs every 20 s (claim_idle_ms / 3), not every 0.1 s.
    async with RedisStreamsTransport(redis_server.url, claim_idle_ms=60_000,
                                     block_ms=100) as streams:
        for i in range(n):
            await streams.publish(Outgoing(topic, b'{"n":%d}' % i))
        reader = Reader(streams.consume([topic], group="workers", consumer="w1", prefetch=64))
        deliveries = [await reader.next() for _ in range(n)]
        reader.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await reader.task
        reads_before = await _reads(raw)
        await asyncio.gather(*(streams.ack(d, [Outgoing(results, d.body)]) for d in deliveries))
        # One pipeline for the lot: Redis reads it in a few socket reads, not one per ack. The
        # count is server-wide: it includes the INFO that reads it (and, should the acks take
        # 20 s, one keep-alive), well within the bound.
        assert await _reads(raw) - reads_before < n // 4
    assert await raw.xlen(results) == n
    assert (await raw.xpending(topic, "workers"))["pending"] == 0
    entries: Any = await raw.xrange(results)
    bodies = sorted(fields[b"envelope"] for _, fields in entries)
    assert bodies == sorted(d.body for d in deliveries)


async def _reads(raw: Redis) -> int:
    return int((await raw.info("stats"))["total_reads_processed"])


class CutProxy:
    """A TCP proxy to Redis that, once armed, drops the connection that carries the next
    ``EVALSHA`` (an ack): ``before`` it reaches Redis, or ``after`` Redis ran it and before its
    reply gets back: the two broken links a retried ``ack`` must survive."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.armed: str | None = None
        self.cut = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.port)
        drop_reply = asyncio.Event()
        back = asyncio.create_task(self._back(server_r, client_w, drop_reply))
        try:
            while data := await client_r.read(65536):
                if self.armed is not None and b"EVALSHA" in data:
                    cut, self.armed = self.armed, None
                    if cut == "before":
                        break
                    drop_reply.set()
                server_w.write(data)
                await server_w.drain()
            self.cut.set()
        finally:
            if not drop_reply.is_set():
                back.cancel()
            with contextlib.suppress(Exception):
                await back
            for writer in (server_w, client_w):
                writer.close()

    async def _back(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    drop_reply: asyncio.Event) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if drop_reply.is_set():  # Redis ran the ack: lose its reply, and the link
                    self.cut.set()
                    writer.close()
                    return
                writer.write(data)
                await writer.drain()


@pytest.mark.parametrize("cut", ["before", "after"])
async def test_an_ack_cut_off_then_retried_publishes_once(redis_server: RedisServer, topic: str,
                                                          raw: Redis, cut: str) -> None:
    results = f"event:{topic}:completed"
    proxy = CutProxy(redis_server.port)
    async with proxy as url, RedisStreamsTransport(url, claim_idle_ms=60_000, block_ms=100) as t:
        await t.publish(Outgoing(topic, REQUEST))
        got = await Reader(t.consume([topic], group="workers", consumer="w1")).next()
        proxy.armed = cut
        with pytest.raises(TransportError) as failure:
            await t.ack(got, [Outgoing(results, b'{"result":1}')])
        assert proxy.cut.is_set()
        assert isinstance(failure.value.__cause__, RedisError | OSError)
        ran = cut == "after"
        # Both or neither: never the result without the ack, nor the reverse.
        assert await raw.xlen(results) == int(ran)
        assert (await raw.xpending(topic, "workers"))["pending"] == int(not ran)
        await t.ack(got, [Outgoing(results, b'{"result":1}')])  # the retry
    assert await raw.xlen(results) == 1
    assert (await raw.xpending(topic, "workers"))["pending"] == 0


async def test_two_consumers_acking_one_reclaimed_entry_publish_once(
        redis_server: RedisServer, topic: str, raw: Redis) -> None:
    """A released entry is reclaimed by another consumer while its first holder still finishes
    it: both ack with a result, the first one wins and the second publishes nothing."""
    results = f"event:{topic}:completed"
    async with RedisStreamsTransport(redis_server.url, claim_idle_ms=300, block_ms=100) as a, \
            RedisStreamsTransport(redis_server.url, claim_idle_ms=300, block_ms=100) as b:
        await a.publish(Outgoing(topic, REQUEST))
        holder = Reader(a.consume([topic], group="workers", consumer="a"))
        first = await holder.next()
        holder.stop()  # or a's own next XAUTOCLAIM would take it back
        a.release(first)
        a.release(first)  # idempotent
        second = await Reader(b.consume([topic], group="workers", consumer="b")).next()
        assert (second.id, second.deliveries) == (first.id, 2)
        await b.ack(second, [Outgoing(results, b'{"by":"b"}')])
        await a.ack(first, [Outgoing(results, b'{"by":"a"}')])
        await b.ack(second, [Outgoing(results, b'{"by":"b"}')])
    entries: Any = await raw.xrange(results)
    assert [fields[b"envelope"] for _, fields in entries] == [b'{"by":"b"}']
    assert (await raw.xpending(topic, "workers"))["pending"] == 0


async def test_a_dead_letter_is_written_once(streams: RedisStreamsTransport, topic: str,
                                             raw: Redis) -> None:
    await streams.publish(Outgoing(topic, REQUEST))
    got = await Reader(streams.consume([topic], group="workers", consumer="w1")).next()
    await streams.reject(got, "bad input")
    await streams.reject(got, "bad input")  # a retry after a lost reply
    await streams.ack(got, [Outgoing(f"event:{topic}:completed", b"{}")])  # settled already
    assert await raw.xlen(dlq_topic(topic)) == 1
    assert await raw.exists(f"event:{topic}:completed") == 0
    assert (await raw.xpending(topic, "workers"))["pending"] == 0


async def test_an_ack_touching_a_non_stream_key_writes_nothing(
        streams: RedisStreamsTransport, topic: str, raw: Redis) -> None:
    """Redis does not roll back a script that fails half-way: it must fail before any write."""
    good, bad = f"event:{topic}:completed", f"event:{topic}:taken"
    await raw.set(bad, b"a string")
    await streams.publish(Outgoing(topic, REQUEST))
    got = await Reader(streams.consume([topic], group="workers", consumer="w1")).next()
    with pytest.raises(TransportError, match="not a stream"):
        await streams.ack(got, [Outgoing(good, b"{}"), Outgoing(bad, b"{}")])
    assert await raw.exists(good) == 0
    assert (await raw.xpending(topic, "workers"))["pending"] == 1
    await streams.ack(got, [Outgoing(good, b"{}")])
    assert await raw.xlen(good) == 1


async def test_acks_after_redis_forgot_the_script(streams: RedisStreamsTransport, topic: str,
                                                  raw: Redis) -> None:
    await streams.publish(Outgoing(topic, REQUEST))
    got = await Reader(streams.consume([topic], group="workers", consumer="w1")).next()
    await raw.script_flush()
    await streams.ack(got, [Outgoing(f"event:{topic}:completed", b"{}")])
    assert await raw.xlen(f"event:{topic}:completed") == 1
    assert (await raw.xpending(topic, "workers"))["pending"] == 0


async def test_a_burst_of_acks_after_redis_forgot_the_script_loads_it_once(
        streams: RedisStreamsTransport, topic: str, raw: Redis) -> None:
    """200 acks at once after a Redis restart (here: SCRIPT FLUSH) all find the settle script
    missing: they load it once between them, and all land. (Each loading it took a pool
    connection of its own: the burst ran the pool dry and failed.)"""
    n, results = 200, f"event:{topic}:completed"
    for i in range(n):
        await streams.publish(Outgoing(topic, b'{"n":%d}' % i))
    reader = Reader(streams.consume([topic], group="workers", consumer="w1", prefetch=n))
    deliveries = [await reader.next() for _ in range(n)]
    await raw.script_flush()
    loads = await _script_loads(raw)
    await asyncio.gather(*(streams.ack(d, [Outgoing(results, d.body)]) for d in deliveries))
    assert await _script_loads(raw) - loads == 1
    assert await raw.xlen(results) == n
    assert (await raw.xpending(topic, "workers"))["pending"] == 0


async def _script_loads(raw: Redis) -> int:
    stats = await raw.info("commandstats")
    return int(stats.get("cmdstat_script|load", {}).get("calls", 0))


# -- (4) Synkro's pub/sub wire -----------------------------------------------------------------

async def test_synkro_publish_round_trip(redis_server: RedisServer, topic: str,
                                         raw: Redis) -> None:
    request = '{"requestId":"r-1","payload":{"input":"x"}}'
    results = f"event:{topic}:completed"
    async with RedisPubSubTransport(redis_server.url) as t:
        listener = raw.pubsub()
        await listener.subscribe(results)
        confirmation: Any = await listener.get_message(timeout=TIMEOUT)
        assert confirmation["type"] == "subscribe"
        reader = Reader(t.consume([topic], group="ignored", consumer="w1"))
        # PUBLISH answers how many subscribers got it: retry until ours is listening.
        for _ in range(int(TIMEOUT / 0.05)):
            if (await cli(redis_server, "PUBLISH", topic, request)).strip() == "1":
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the consumer never subscribed")
        got = await reader.next()
        assert (got.topic, got.body) == (topic, request.encode())
        await t.ack(got, [Outgoing(results, b'{"requestId":"r-1","debateStatus":"completed"}')])
        message = await listener.get_message(ignore_subscribe_messages=True, timeout=TIMEOUT)
        assert message is not None
        assert message["data"] == b'{"requestId":"r-1","debateStatus":"completed"}'
        await listener.aclose()  # type: ignore[no-untyped-call]


async def test_pubsub_dead_letters_are_kept_in_a_stream(redis_server: RedisServer, topic: str,
                                                        raw: Redis) -> None:
    async with RedisPubSubTransport(redis_server.url) as t:
        subscription = await t.subscribe([topic])
        await cli(redis_server, "PUBLISH", topic, "not json")
        got = await Reader(subscription).next()
        delivery = Delivery(topic, got.body, got.id)
        await t.reject(delivery, "the body is not JSON")
    dead: Any = await raw.xrange(dlq_topic(topic))
    ((_, fields),) = dead
    assert fields[b"envelope"] == b"not json"
    assert fields[b"reason"] == b"the body is not JSON"


# -- (5) failures are TransportError, never a redis exception --------------------------------

@pytest.mark.parametrize("scheme", ["redis", "redis+pubsub"])
async def test_unreachable_redis_raises_transport_error_naming_the_fix(scheme: str) -> None:
    port = free_port()
    t = transport_from_url(f"{scheme}://127.0.0.1:{port}/0", connect_timeout=2.0)
    with pytest.raises(TransportError) as failure:
        await asyncio.wait_for(t.connect(), 30)
    assert f"127.0.0.1:{port}" in str(failure.value)
    assert "redis-server running" in str(failure.value)
    assert isinstance(failure.value.__cause__, RedisError | OSError)
    await t.close()


def test_a_pool_run_dry_is_not_called_unreachable() -> None:
    error = transport_error(MaxConnectionsError("Too many connections"), "127.0.0.1:6390")
    assert "every connection of the pool to Redis at 127.0.0.1:6390 is in use" in str(error)
    assert "running there" not in str(error)


async def test_redis_going_away_raises_transport_error() -> None:
    server = RedisServer.start(appendonly=False)
    try:
        async with RedisStreamsTransport(server.url, block_ms=100, connect_timeout=2.0) as t:
            await t.publish(Outgoing("x:y", b"z"))
            server.stop()
            with pytest.raises(TransportError) as publishing:
                await asyncio.wait_for(t.publish(Outgoing("x:y", b"z")), 30)

            async def consume() -> None:
                async for _ in t.consume(["x:y"], group="g", consumer="c"):
                    pass

            with pytest.raises(TransportError) as consuming:
                await asyncio.wait_for(consume(), 30)
        for failure in (publishing, consuming):
            assert isinstance(failure.value.__cause__, RedisError | OSError)
    finally:
        server.stop()


async def test_read_range_pages_through_a_stream(streams: RedisStreamsTransport, topic: str,
                                                 raw: Redis) -> None:
    pipe = raw.pipeline(transaction=False)
    for i in range(1203):
        pipe.xadd(topic, {"envelope": b"%d" % i})
    ids = [i.decode() for i in await pipe.execute()]
    assert [int(d.body) async for d in streams.read_range(topic)] == list(range(1203))
    assert [d.id async for d in streams.read_range(topic, ids[500], count=3)] == ids[500:503]
    assert [d.id async for d in streams.read_range(topic, ids[1200])] == ids[1200:]


def test_our_command_packer_writes_what_redis_py_writes() -> None:
    from redis.asyncio.connection import Connection

    from debatebus._redis.connection import pack_commands

    commands = [("MULTI",), ("XADD", "debate:é", "MAXLEN", "~", 1000, "*", b"envelope", b"\x00\xff"),
                ("XACK", "debate:é", "workers", "1-0", "2-0"), ("EXEC",)]
    expected = b"".join(Connection().pack_commands([list(c) for c in commands]))
    assert pack_commands(commands) == expected


async def test_pubsub_warns_once_that_channels_ignore_the_db(
        redis_server: RedisServer, topic: str, caplog: pytest.LogCaptureFixture) -> None:
    """PUBLISH on db 5 reaches a subscriber of db 3: channels belong to the server. A pub/sub
    transport given a db other than 0 says so once, when it first connects."""
    caplog.set_level(logging.WARNING, logger="debatebus")
    on_3 = RedisPubSubTransport(redis_server.url.removesuffix("/0") + "/3", synkro=None)
    async with on_3:
        reader = Reader(await on_3.subscribe([topic]))
        other_db = Redis.from_url(redis_server.url.removesuffix("/0") + "/5")
        try:
            await other_db.publish(topic, REQUEST)
        finally:
            await other_db.aclose()
        assert (await reader.next()).body == REQUEST
        reader.task.cancel()
    await on_3.connect()  # again: said already
    await on_3.close()
    async with RedisPubSubTransport(redis_server.url, synkro=None):  # db 0: nothing to say
        pass
    said = [r for r in caplog.records if "ignores the db number" in r.getMessage()]
    assert len(said) == 1
    assert said[0].levelname == "WARNING"
    assert "not only db 3's" in said[0].getMessage()


async def test_reclaiming_counts_no_delivery_for_an_entry_this_consumer_still_works_on(
        redis_server: RedisServer, raw: Redis, topic: str) -> None:
    """Delivery counts rise only when an entry really goes to another consumer (or back to this
    one after a release): an entry of this consumer's, idle because its loop stalled past a
    keep-alive, is passed over by the reclaim without a delivery counted."""
    async with RedisStreamsTransport(redis_server.url, claim_idle_ms=60_000) as streams:
        await streams.publish(Outgoing(topic, b'{"requestId": "stalled", "payload": {}}'))
        stream = streams.consume([topic], group="g", consumer="c1")
        first = await asyncio.wait_for(anext(stream), 10)
        # The loop stalled: the entry looks idle for longer than claim_idle_ms.
        await raw.xclaim(topic, "g", "c1", 0, [first.id], idle=120_000, justid=True)
        assert await streams._groups._reclaim([seat_of(first)], 10) == []
        (pending,) = await raw.xpending_range(topic, "g", "-", "+", 1)
        assert pending["times_delivered"] == 1, "a delivery was counted that never happened"
        assert pending["time_since_delivered"] < 60_000  # the reclaim claimed it: refreshed
        await stream.aclose()  # type: ignore[attr-defined]
