"""The command batcher on a real redis-server: pipelines in order, per-job errors, a server that
goes quiet, restarts or is unreachable, TLS, and a client that keeps working after the batcher
stops (the batcher's connection is its own: see test_redis_connection.py for the rest)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from tests.support.servers import RedisServer, free_port, wait_for_port

from debatebus._redis import CommandBatcher, NotSentError, build_client
from debatebus.exceptions import TransportError

pytestmark = pytest.mark.redis


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = build_client(redis_server.url, connect_timeout=5.0)
    yield client
    await client.aclose()


async def test_jobs_of_one_tick_share_a_pipeline_and_keep_their_order(client: Redis) -> None:
    batcher = CommandBatcher(client, "test", timeout=10.0)
    batcher.start()
    try:
        # 200 jobs queued without awaiting: each gets its own replies, in queue order.
        futures = [batcher.enqueue([("RPUSH", "pipe:order", str(i)), ("LLEN", "pipe:order")])
                   for i in range(200)]
        replies = [await f for f in futures]
        assert replies == [[i + 1, i + 1] for i in range(200)]
        assert await client.lrange("pipe:order", 0, -1) == [str(i).encode() for i in range(200)]
    finally:
        await batcher.stop()


async def test_a_failing_command_fails_only_its_own_job(client: Redis) -> None:
    batcher = CommandBatcher(client, "test", timeout=10.0)
    batcher.start()
    try:
        await client.set("pipe:string", "x")
        good = batcher.enqueue([("INCR", "pipe:counter")])
        bad = batcher.enqueue([("RPUSH", "pipe:string", "y")])  # WRONGTYPE
        checked = batcher.enqueue([("GET", "pipe:string")], check=lambda r: [r[0].decode()])
        assert await good == [1]
        with pytest.raises(TransportError, match="WRONGTYPE"):
            await bad
        assert await checked == ["x"]
    finally:
        await batcher.stop()


async def test_a_silent_server_times_out_and_the_next_pipeline_reconnects(client: Redis) -> None:
    batcher = CommandBatcher(client, "test", timeout=0.3)
    batcher.start()
    pauser = Redis(connection_pool=client.connection_pool)
    try:
        assert await batcher.submit([("SET", "pipe:k", "1")]) == [b"OK"]
        await pauser.execute_command("CLIENT", "PAUSE", "1500", "ALL")
        with pytest.raises(TransportError, match="did not answer in time") as silent:
            await batcher.submit([("GET", "pipe:k")])
        assert not isinstance(silent.value, NotSentError), "it was written: it may have run"
        await asyncio.sleep(1.5)  # the pause is over
        assert await batcher.submit([("GET", "pipe:k")]) == [b"1"]
    finally:
        await batcher.stop()


async def test_a_restarted_server_is_reconnected_to_without_losing_a_job() -> None:
    server = RedisServer.start(appendonly=True)
    client = build_client(server.url, connect_timeout=5.0)
    batcher = CommandBatcher(client, "test", timeout=10.0)
    batcher.start()
    try:
        assert await batcher.submit([("SET", "pipe:k", "before")]) == [b"OK"]
        await asyncio.to_thread(server.restart)
        # The old connection died while idle: the next job goes out on a new one.
        assert await batcher.submit([("GET", "pipe:k")]) == [b"before"]
    finally:
        await batcher.stop()
        await client.aclose()
        server.stop()


async def test_stop_sends_what_is_queued_and_leaves_the_client_working(client: Redis) -> None:
    batcher = CommandBatcher(client, "test", timeout=10.0)
    batcher.start()
    queued = batcher.enqueue([("SET", "pipe:last", "sent")])
    await batcher.stop()
    assert await queued == [b"OK"]
    with pytest.raises(TransportError, match="not connected"):
        batcher.enqueue([("PING",)])
    # The client's own connections are untouched, and closing it does not hang.
    assert await asyncio.wait_for(client.get("pipe:last"), 5) == b"sent"


async def test_nothing_waits_forever_on_an_unreachable_server() -> None:
    client = build_client(f"redis://127.0.0.1:{free_port()}/0", connect_timeout=0.5)
    batcher = CommandBatcher(client, "nowhere", timeout=0.5)
    batcher.start()
    try:
        # Never sent (no connection could be opened): safe to send again, whatever it is.
        with pytest.raises(NotSentError, match="redis-server running"):
            await asyncio.wait_for(batcher.submit([("PING",)]), 10)
        # Stopped while the next connection attempt is still under way: the job fails, now.
        pending = batcher.enqueue([("PING",)])
        await asyncio.wait_for(batcher.stop(), 10)
        with pytest.raises(NotSentError):
            await asyncio.wait_for(pending, 1)
    finally:
        await batcher.stop()
        await client.aclose()


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[str]:
    """A redis-server speaking only TLS, with a throwaway self-signed certificate."""
    openssl, server = shutil.which("openssl"), shutil.which("redis-server")
    if openssl is None or server is None:
        pytest.skip("needs openssl and redis-server")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen([server, "--port", "0", "--tls-port", str(port), "--tls-cert-file",
                             str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
                             "--tls-auth-clients", "no", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, proc=proc)
    except RuntimeError:
        pytest.skip("this redis-server was built without TLS")
    try:
        yield f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    finally:
        proc.terminate()
        proc.wait(10)


async def test_the_batcher_opens_its_own_tls_connection(tls_server: str) -> None:
    client = build_client(tls_server, connect_timeout=5.0)
    batcher = CommandBatcher(client, "tls", timeout=10.0)
    batcher.start()
    try:
        futures = [batcher.enqueue([("RPUSH", "pipe:tls", str(i))]) for i in range(100)]
        assert [await f for f in futures] == [[i + 1] for i in range(100)]
    finally:
        await batcher.stop()
    assert await asyncio.wait_for(client.llen("pipe:tls"), 5) == 100
    await client.aclose()


async def test_a_certificate_that_cannot_be_verified_is_a_tls_error(tls_server: str) -> None:
    client = build_client(tls_server.split("?")[0], connect_timeout=5.0)  # no ssl_ca_certs
    batcher = CommandBatcher(client, "tls", timeout=5.0)
    batcher.start()
    try:
        with pytest.raises(TransportError, match="TLS handshake"):
            await batcher.submit([("PING",)])
    finally:
        await batcher.stop()
        await client.aclose()
