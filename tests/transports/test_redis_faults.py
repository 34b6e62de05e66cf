"""The Redis transports under faults, on private redis-servers: Redis losing its data, a frozen
server (SIGSTOP, CLIENT PAUSE), connections dropped under a consumer (CLIENT KILL, ``timeout 1``).

What must hold: every call fails with ``TransportError`` within its timeout rather than hanging;
``consume`` called again after one carries on; a retried ack lands exactly once. Deadlines are
generous upper bounds, never performance assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
from redis.asyncio import Redis
from tests.support.servers import RedisServer
from tests.support.transports import Reader, with_protocol

from debatebus.exceptions import TransportError
from debatebus.transports._base import RECOVERED_HEADER, Delivery, Outgoing
from debatebus.transports._redis_pubsub import RedisPubSubTransport
from debatebus.transports._redis_streams import RedisStreamsTransport

pytestmark = pytest.mark.redis

DEADLINE = 60.0
PAUSE_S = 6.0


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private redis-server without persistence, which a test may freeze or restart empty."""
    own = RedisServer.start(appendonly=False)
    try:
        yield own
    finally:
        assert own.proc is not None
        own.proc.send_signal(signal.SIGCONT)
        own.stop()


@pytest.fixture
async def raw(server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(server.url)
    yield client
    await client.aclose()


@pytest.fixture
def topic() -> str:
    return f"debate:{uuid.uuid4().hex[:10]}"


def _sync(server: RedisServer) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=10)


@contextlib.contextmanager
def frozen(server: RedisServer, how: str) -> Iterator[None]:
    """redis-server that accepts connections and answers nothing, until the block ends (SIGSTOP;
    or CLIENT PAUSE for a fixed time, since nothing can UNPAUSE a server paused for ALL)."""
    assert server.proc is not None
    if how == "sigstop":
        server.proc.send_signal(signal.SIGSTOP)
    else:
        with _sync(server) as c:
            c.execute_command("CLIENT", "PAUSE", int(PAUSE_S * 1000), "ALL")
    started = time.monotonic()
    try:
        yield
    finally:
        if how == "sigstop":
            server.proc.send_signal(signal.SIGCONT)
        else:
            assert time.monotonic() - started < PAUSE_S, "the pause ended before the test did"
            time.sleep(max(0.0, PAUSE_S - (time.monotonic() - started)))


async def _first_error(it: AsyncIterator[Delivery]) -> TransportError:
    with pytest.raises(TransportError) as failure:
        async for _ in it:
            pass
    return failure.value


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("how", ["sigstop", "client_pause"])
async def test_a_frozen_redis_fails_calls_in_time_and_consuming_resumes(
        server: RedisServer, raw: Redis, topic: str, how: str, protocol: int) -> None:
    results = f"event:{topic}:completed"
    url = with_protocol(server.url, protocol)
    async with RedisStreamsTransport(url, claim_idle_ms=60_000, block_ms=100,
                                     command_timeout=1.0) as t:
        await t.publish(Outgoing(topic, b"before"))
        reader = t.consume([topic], group="workers", consumer="w1")
        held = await anext(reader)
        with frozen(server, how):
            # Both bounded by command_timeout (+ block_ms for the read): DEADLINE only catches a hang.
            await asyncio.wait_for(_first_error(reader), DEADLINE)
            with pytest.raises(TransportError):
                await asyncio.wait_for(t.ack(held, [Outgoing(results, b"r")]), DEADLINE)
            with pytest.raises(TransportError):
                await asyncio.wait_for(anext(t.consume([topic], group="workers", consumer="w1")),
                                       DEADLINE)
        await t.publish(Outgoing(topic, b"after"))
        again = await asyncio.wait_for(anext(t.consume([topic], group="workers", consumer="w1")),
                                       DEADLINE)
        assert again.body == b"after"
        await t.ack(held, [Outgoing(results, b"r")])  # the retry of the ack that failed
        await t.ack(again, [Outgoing(results, b"r")])
    assert await raw.xlen(results) == 2
    assert (await raw.xpending(topic, "workers"))["pending"] == 0


async def test_keepalive_logs_one_warning_per_outage_and_recovers(
        server: RedisServer, raw: Redis, topic: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="debatebus.transports.redis")
    async with RedisStreamsTransport(server.url, claim_idle_ms=300, block_ms=100,
                                     command_timeout=0.3) as t:
        await t.publish(Outgoing(topic, b"held"))
        reader = Reader(t.consume([topic], group="workers", consumer="w1"))
        held = await reader.next()
        reader.stop()
        with frozen(server, "sigstop"):
            await asyncio.sleep(2.0)  # about 6 refresh rounds, every one failing
        for _ in range(int(DEADLINE / 0.1)):
            if "answers again" in caplog.text:
                break
            await asyncio.sleep(0.1)
        await t.ack(held)
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    warnings = [m for level, m in messages if level == logging.WARNING]
    assert len(warnings) == 1, messages
    assert "cannot keep held entries alive" in warnings[0]
    assert sum("answers again" in m for level, m in messages if level == logging.INFO) == 1
    assert (await raw.xpending(topic, "workers"))["pending"] == 0


async def test_consuming_again_after_redis_lost_its_data(server: RedisServer, topic: str) -> None:
    """A restart without persistence drops the stream and the group (NOGROUP): consuming again
    makes them again. An ack of an entry Redis forgot cannot acknowledge it, and nobody else can
    answer it: its result is published anyway, marked ``RECOVERED_HEADER``."""
    results = f"event:{topic}:completed"
    async with RedisStreamsTransport(server.url, claim_idle_ms=500, block_ms=100,
                                     command_timeout=2.0) as t:
        await t.publish(Outgoing(topic, b"lost"))
        reader = t.consume([topic], group="workers", consumer="w1")
        forgotten = await anext(reader)
        await asyncio.to_thread(server.restart)
        got: Delivery | None = None
        for _ in range(20):  # the worker's loop: consume again after each TransportError
            with contextlib.suppress(TransportError):
                await t.publish(Outgoing(topic, b"new"))
                got = await asyncio.wait_for(anext(reader), DEADLINE)
                break
            reader = t.consume([topic], group="workers", consumer="w1")
            await asyncio.sleep(0.2)
        assert got is not None
        assert got.body == b"new"
        await t.ack(got, [Outgoing(results, b"r-new")])
        await t.ack(forgotten, [Outgoing(results, b"r-lost")])
        client = Redis.from_url(server.url)
        try:
            entries: Any = await client.xrange(results)
            assert [f[b"envelope"] for _, f in entries] == [b"r-new", b"r-lost"]
            marks = [json.loads(f.get(b"headers", b"{}")).get(RECOVERED_HEADER)
                     for _, f in entries]
            assert marks == [None, "request-lost"]
            assert (await client.xpending(topic, "workers"))["pending"] == 0
        finally:
            await client.aclose()


@pytest.mark.parametrize("protocol", [2, 3])
async def test_pubsub_notices_a_frozen_redis_and_subscribes_again(
        server: RedisServer, raw: Redis, topic: str, protocol: int) -> None:
    async with RedisPubSubTransport(with_protocol(server.url, protocol), command_timeout=1.0,
                                    poll_ms=50) as t:
        reader = t.consume([topic], group="ignored", consumer="w1")
        with frozen(server, "sigstop"):
            await asyncio.wait_for(_first_error(reader), DEADLINE)
        reader = t.consume([topic], group="ignored", consumer="w1")
        pending = asyncio.ensure_future(anext(reader))
        for _ in range(int(DEADLINE / 0.05)):  # PUBLISH says how many subscribers got it
            if await raw.publish(topic, b"again"):
                break
            await asyncio.sleep(0.05)
        got = await asyncio.wait_for(pending, DEADLINE)
        assert got.body == b"again"
        t.release(got)  # handed out again, from the same topics' consume
        assert (await asyncio.wait_for(anext(reader), DEADLINE)).deliveries == 2


async def _publish_in_bursts(t: RedisStreamsTransport, topic: str, n: int) -> None:
    """Three bursts, 2.5 s apart: long enough for ``timeout 1`` (checked in whole seconds) to
    close the connections that idle in between."""
    for burst in range(3):
        for i in range(burst * n // 3, (burst + 1) * n // 3 if burst < 2 else n):
            while True:
                try:
                    await t.publish(Outgoing(topic, b"%d" % i))
                    break
                except TransportError:
                    await asyncio.sleep(0.05)
        await asyncio.sleep(2.5)


async def _ack_until_it_lands(t: RedisStreamsTransport, delivery: Delivery, results: str) -> None:
    while True:
        try:
            await t.ack(delivery, [Outgoing(results, delivery.body)])
            return
        except TransportError:
            await asyncio.sleep(0.05)


async def _kill_clients_every(server: RedisServer, interval: float) -> None:
    killer = Redis.from_url(server.url)  # CLIENT KILL skips the caller's own connection
    try:
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):
                await killer.execute_command("CLIENT", "KILL", "TYPE", "normal")
    finally:
        await killer.aclose()


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["client_kill", "timeout_1"])
async def test_200_messages_acked_exactly_once_while_connections_drop(
        server: RedisServer, topic: str, fault: str) -> None:
    n, results = 200, f"event:{topic}:completed"
    faults: list[asyncio.Task[None]] = []
    if fault == "timeout_1":
        with _sync(server) as c:
            c.config_set("timeout", "1")
    elif fault == "client_kill":
        faults.append(asyncio.create_task(_kill_clients_every(server, 0.3)))
    acked: set[bytes] = set()
    with _sync(server) as c:
        connections = int(c.info("stats")["total_connections_received"])
    # With Redis's timeout of 1 s, the reclaim (every claim_idle_ms / 2, on the command
    # connection) must leave that connection idle for longer, or the fault never bites it.
    claim_idle_ms = 6000 if fault == "timeout_1" else 500
    async with RedisStreamsTransport(server.url, claim_idle_ms=claim_idle_ms, block_ms=100,
                                     command_timeout=2.0) as t:
        faults.append(asyncio.create_task(_publish_in_bursts(t, topic, n)))

        async def work() -> None:
            while len(acked) < n:
                try:
                    async for delivery in t.consume([topic], group="workers", consumer="w1"):
                        await _ack_until_it_lands(t, delivery, results)
                        acked.add(delivery.body)
                        if len(acked) == n:
                            return
                except TransportError:
                    await asyncio.sleep(0.05)

        try:
            await asyncio.wait_for(work(), 120)
        finally:
            for task in faults:
                task.cancel()
            await asyncio.gather(*faults, return_exceptions=True)
    with _sync(server) as c:
        assert c.xpending(topic, "workers")["pending"] == 0
        entries: Any = c.xrange(results)
        # A publish whose reply was lost is retried, and XADD cannot tell a retry from a new
        # message: the request stream, not the publisher's count, says what was asked.
        requests: Any = c.xrange(topic)
        # The fault did bite: connections were dropped and made again.
        reconnects = int(c.info("stats")["total_connections_received"]) - connections
    assert reconnects >= 5, f"{reconnects} connections made: a fault-free run makes 3"
    bodies = sorted(fields[b"envelope"] for _, fields in entries)
    asked = sorted(fields[b"envelope"] for _, fields in requests)
    assert set(asked) == {b"%d" % i for i in range(n)}
    assert bodies == asked  # each request entry answered exactly once
