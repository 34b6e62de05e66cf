"""The command batcher's own connection: frames nobody asked for, closing in any order, auth,
db selection, unix sockets, RESP2 under a ``protocol=3`` URL, and a server that is paused, stopped
(SIGSTOP), killed or silent — never a hang, never one caller's reply handed to another."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hiredis
import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthorizationError, NoScriptError
from tests.support.servers import RedisServer

from debatebus._redis import Command, CommandBatcher, build_client, map_redis_errors
from debatebus.checkpoints import CheckpointStore, store_from_url
from debatebus.exceptions import ConfigError, TransportError
from debatebus.transports import Transport, transport_from_url

PUSH = b">3\r\n$10\r\ninvalidate\r\n*1\r\n$2\r\nk3\r\n$-1\r\n"  # a RESP3 push frame


# ---- a fake server: scripted replies, and frames injected where the test says ------------------


@dataclass
class FakeRedis:
    """Answers ``GET k`` with ``value-of-k`` and ``ECHO x`` with ``x``; writes ``inject`` right
    after the reply to ``GET <inject_after>`` (or after all the replies to the read that held it,
    when ``between``); ``silent`` answers nothing at all."""

    inject_after: bytes | None = None
    inject: bytes = PUSH
    between: bool = False
    silent: bool = False
    connections: int = 0
    server: asyncio.Server | None = None
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        assert self.server is not None
        for writer in self.writers:
            writer.close()
        self.server.close()
        await self.server.wait_closed()

    def _reply(self, command: list[bytes]) -> bytes:
        name = command[0].upper()
        if name == b"GET":
            value = b"value-of-" + command[1]
            reply = b"$%d\r\n%s\r\n" % (len(value), value)
            injected = command[1] == self.inject_after and not self.between
            return reply + (self.inject if injected else b"")
        if name == b"ECHO":
            return b"$%d\r\n%s\r\n" % (len(command[1]), command[1])
        return b"+OK\r\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        parser = hiredis.Reader()
        while data := await reader.read(65536):
            parser.feed(data)
            out = bytearray()
            tail = b""
            while (command := parser.gets()) is not False:
                out += self._reply(command)
                if self.between and command[1:2] == [self.inject_after]:
                    tail = self.inject
            out += tail
            if not self.silent:
                writer.write(bytes(out))
                await writer.drain()
        writer.close()


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeRedis, Redis]]:
    server = FakeRedis()
    port = await server.start()
    client = build_client(f"redis://127.0.0.1:{port}/0", connect_timeout=1.0)
    yield server, client
    await client.aclose()
    await server.close()


async def test_a_frame_injected_mid_pipeline_is_never_taken_for_a_reply(
        fake: tuple[FakeRedis, Redis]) -> None:
    server, client = fake
    server.inject_after = b"k3"
    batcher = CommandBatcher(client, "fake", timeout=5.0)
    batcher.start()
    try:
        futures = [batcher.enqueue([("GET", f"k{i}")]) for i in range(8)]
        await asyncio.sleep(0)  # a second pipeline, sent behind the first
        futures += [batcher.enqueue([("GET", f"k{i}")]) for i in range(8, 16)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        for i, result in enumerate(results):
            assert isinstance(result, TransportError) or result == [f"value-of-k{i}".encode()]
        assert all(isinstance(r, TransportError) for r in results[:8])
        assert "more replies than commands" in str(results[0])
        # The poisoned connection is gone: the next pipeline goes out on a new one.
        server.inject_after = None
        assert await batcher.submit([("GET", "k99")]) == [b"value-of-k99"]
        assert server.connections == 2
    finally:
        await batcher.stop()


async def test_a_frame_arriving_between_pipelines_is_never_taken_for_the_next_reply(
        fake: tuple[FakeRedis, Redis]) -> None:
    server, client = fake
    server.inject_after, server.inject, server.between = b"first", b":42\r\n", True
    batcher = CommandBatcher(client, "fake", timeout=5.0)
    batcher.start()
    try:
        assert await batcher.submit([("GET", "first")]) == [b"value-of-first"]
        await asyncio.sleep(0.05)  # the stray :42 arrives while nothing is in flight
        assert await batcher.submit([("GET", "second")]) == [b"value-of-second"]
        assert server.connections == 2
    finally:
        await batcher.stop()


async def test_a_handshake_without_an_answer_fails_within_the_connect_timeout() -> None:
    server = FakeRedis(silent=True)
    port = await server.start()
    client = build_client(f"redis://:pw@127.0.0.1:{port}/0", connect_timeout=0.3)
    batcher = CommandBatcher(client, "silent", timeout=30.0)
    batcher.start()
    try:
        with pytest.raises(TransportError, match="did not answer in time"):
            await asyncio.wait_for(batcher.submit([("PING",)]), 5)
    finally:
        await batcher.stop()
        await client.aclose()
        await server.close()


# ---- a real redis-server ------------------------------------------------------------------------


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    server = RedisServer.start(appendonly=True, appendfsync="always")
    yield server
    server.stop()


@pytest.mark.redis
@pytest.mark.parametrize("client_first", [True, False])
async def test_client_and_batcher_close_in_either_order(redis_server: RedisServer,
                                                        client_first: bool) -> None:
    client = build_client(redis_server.url, connect_timeout=5.0)
    batcher = CommandBatcher(client, "test", timeout=5.0)
    batcher.start()
    assert await client.ping()
    assert await batcher.submit([("SET", "conn:order", "1")]) == [b"OK"]
    if client_first:
        await asyncio.wait_for(client.aclose(), 2)
        # The batcher's connection is its own: closing the client does not touch it.
        assert await batcher.submit([("GET", "conn:order")]) == [b"1"]
        await asyncio.wait_for(batcher.stop(), 2)
    else:
        await asyncio.wait_for(batcher.stop(), 2)
        assert await client.get("conn:order") == b"1"
        await asyncio.wait_for(client.aclose(), 2)


@pytest.mark.redis
async def test_a_protocol_3_url_still_gets_a_resp2_batcher(redis_server: RedisServer) -> None:
    client = build_client(redis_server.url + "?protocol=3", connect_timeout=5.0)
    batcher = CommandBatcher(client, "test", timeout=5.0)
    batcher.start()
    try:
        [info] = await batcher.submit([("CLIENT", "INFO")])
        assert b"resp=2" in info.split()
        assert await client.ping()  # the client's own connections keep RESP3
    finally:
        await batcher.stop()
        await client.aclose()


@pytest.mark.redis
async def test_an_unknown_script_keeps_no_script_error_as_the_cause(redis_server: RedisServer) -> None:
    client = build_client(redis_server.url, connect_timeout=5.0)
    batcher = CommandBatcher(client, "test", timeout=5.0)
    batcher.start()
    try:
        with pytest.raises(TransportError) as caught:
            await batcher.submit([("EVALSHA", "0" * 40, 0)])
        assert isinstance(caught.value.__cause__, NoScriptError)
    finally:
        await batcher.stop()
        await client.aclose()


@pytest.mark.redis
async def test_a_killed_connection_is_replaced_at_the_next_pipeline(redis_server: RedisServer) -> None:
    client = build_client(redis_server.url, connect_timeout=5.0)
    batcher = CommandBatcher(client, "test", timeout=5.0)
    batcher.start()
    try:
        [first] = await batcher.submit([("CLIENT", "ID")])
        assert await client.execute_command("CLIENT", "KILL", "ID", first) == 1
        await asyncio.sleep(0.05)
        [second] = await batcher.submit([("CLIENT", "ID")])
        assert second != first
    finally:
        await batcher.stop()
        await client.aclose()


async def _batcher(url: str, timeout: float = 5.0) -> tuple[Redis, CommandBatcher]:
    client = build_client(url, connect_timeout=timeout)
    batcher = CommandBatcher(client, "test", timeout=timeout)
    batcher.start()
    return client, batcher


async def _close(client: Redis, batcher: CommandBatcher) -> None:
    await batcher.stop()
    await client.aclose()


async def _answered(batcher: CommandBatcher, commands: list[Command],
                    within: float = 20.0) -> list[Any]:
    """``commands``' replies, submitted again after each timeout for up to ``within`` seconds: a
    batcher whose timeout is short enough to see a pause in a test still answers on a loaded
    machine, and answers again once a pause ends, whenever that is."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await asyncio.wait_for(batcher.submit(commands), 5)
        except TransportError as exc:
            if "did not answer in time" not in str(exc) or time.monotonic() > deadline:
                raise


@pytest.mark.redis
async def test_sigstop_fails_callers_in_time_and_sigcont_brings_the_batcher_back(
        own_server: RedisServer) -> None:
    client, batcher = await _batcher(own_server.url, timeout=0.5)
    try:
        assert await batcher.submit([("SET", "conn:k", "1")]) == [b"OK"]
        own_server.pause()
        for _ in range(2):  # on the stalled connection, then on a new one that gets no answer
            started = time.monotonic()
            with pytest.raises(TransportError, match="did not answer in time"):
                await asyncio.wait_for(batcher.submit([("GET", "conn:k")]), 5)
            assert time.monotonic() - started < 3
        own_server.resume()
        assert await batcher.submit([("GET", "conn:k")]) == [b"1"]
    finally:
        own_server.resume()
        await _close(client, batcher)


@pytest.mark.redis
async def test_client_pause_during_a_reconnect_with_select(own_server: RedisServer) -> None:
    client, batcher = await _batcher(own_server.url.replace("/0", "/2"), timeout=0.5)
    try:
        assert await _answered(batcher, [("SET", "conn:k", "db2")]) == [b"OK"]
        # 4 s: the two timeouts below take about 1 s (CLIENT UNPAUSE would wait on the pause too).
        own_server.client().execute_command("CLIENT", "PAUSE", "4000", "ALL")
        for _ in range(2):  # the second one reconnects: AUTH/SELECT wait on the pause too
            with pytest.raises(TransportError, match="did not answer in time"):
                await asyncio.wait_for(batcher.submit([("GET", "conn:k")]), 5)
        assert await _answered(batcher, [("GET", "conn:k")]) == [b"db2"]  # once the pause ends
    finally:
        await _close(client, batcher)


@pytest.mark.redis
async def test_kill_9_fails_what_is_in_flight_and_a_restart_is_reconnected_to(
        own_server: RedisServer) -> None:
    client, batcher = await _batcher(own_server.url, timeout=10.0)
    try:
        assert await batcher.submit([("SET", "conn:k", "kept")]) == [b"OK"]
        # In flight when Redis dies (BLPOP blocks).
        blocked = batcher.enqueue([("BLPOP", "conn:never", 8)])
        await asyncio.sleep(0.2)
        own_server.kill9()
        with pytest.raises(TransportError, match="cannot reach Redis"):
            await asyncio.wait_for(blocked, 5)
        # Still down: the next job fails at once, it does not wait for the server to return.
        started = time.monotonic()
        with pytest.raises(TransportError, match="cannot reach Redis"):
            await asyncio.wait_for(batcher.submit([("PING",)]), 5)
        assert time.monotonic() - started < 3
        await asyncio.to_thread(own_server.restart_same_port)
        assert await batcher.submit([("GET", "conn:k")]) == [b"kept"]
    finally:
        await _close(client, batcher)


@pytest.fixture
def password_server() -> Iterator[RedisServer]:
    server = RedisServer.start(appendonly=False, password="s3cret-pass")
    server.client().execute_command("ACL", "SETUSER", "alice", "on", ">alice-pass", "~*", "&*",
                                    "+@all")
    yield server
    server.stop()


@pytest.mark.redis
@pytest.mark.parametrize("auth", [":wrong-pass-42@", "alice:wrong-pass-42@", ""])
async def test_refused_credentials_are_a_config_error_without_the_password(
        password_server: RedisServer, auth: str) -> None:
    client, batcher = await _batcher(f"redis://{auth}127.0.0.1:{password_server.port}/0")
    try:
        with pytest.raises(ConfigError, match="refused the credentials") as caught:
            await batcher.submit([("PING",)])
        assert not isinstance(caught.value, TransportError)
        assert "wrong-pass-42" not in str(caught.value)
        assert "s3cret-pass" not in str(caught.value)
    finally:
        await _close(client, batcher)


@pytest.mark.redis
async def test_user_password_and_db_are_used(password_server: RedisServer) -> None:
    client, batcher = await _batcher(f"redis://alice:alice-pass@127.0.0.1:{password_server.port}/3")
    try:
        assert await batcher.submit([("ACL", "WHOAMI"), ("SET", "conn:db", "3")]) == [b"alice", b"OK"]
    finally:
        await _close(client, batcher)
    with password_server.client() as sync:
        sync.select(3)
        assert sync.get("conn:db") == b"3"


@pytest.mark.redis
async def test_a_db_the_server_does_not_have_is_a_config_error(redis_server: RedisServer) -> None:
    client, batcher = await _batcher(redis_server.url.replace("/0", "/99"))
    try:
        with pytest.raises(ConfigError, match="refused to select db 99"):
            await batcher.submit([("PING",)])
    finally:
        await _close(client, batcher)


@pytest.mark.redis
@pytest.mark.parametrize("scheme", ["redis", "redis+pubsub", "store"])
async def test_connecting_to_a_db_the_server_does_not_have_says_how_many_it_has(
        redis_server: RedisServer, scheme: str) -> None:
    url = redis_server.url.replace("/0", "/99")
    component: Transport | CheckpointStore = (
        store_from_url(url) if scheme == "store"
        else transport_from_url(url.replace("redis://", f"{scheme}://", 1)))
    try:
        with pytest.raises(ConfigError) as caught:
            await component.connect()
    finally:
        await component.close()
    assert str(caught.value) == (
        f"Redis at 127.0.0.1:{redis_server.port}: database 99 does not exist on this server (it"
        " has 16: databases 0..15): fix the /N after host:port in the URL")


@pytest.mark.redis
async def test_map_redis_errors_makes_refused_credentials_a_config_error(
        password_server: RedisServer) -> None:
    client = build_client(f"redis://:wrong-pass-42@127.0.0.1:{password_server.port}/0",
                          connect_timeout=5.0)
    try:
        with (pytest.raises(ConfigError, match="refused the credentials") as caught,
              map_redis_errors("here")):
            await client.ping()
        assert "wrong-pass-42" not in str(caught.value)
    finally:
        await client.aclose()
    with pytest.raises(ConfigError), map_redis_errors("here"):
        raise AuthorizationError("not allowed")


async def test_unusable_tls_files_are_a_config_error(tmp_path: Path) -> None:
    client, batcher = await _batcher(f"rediss://127.0.0.1:1/0?ssl_ca_certs={tmp_path}/missing.pem")
    try:
        with pytest.raises(ConfigError, match="TLS"):
            await batcher.submit([("PING",)])
    finally:
        await _close(client, batcher)


@pytest.fixture
def unix_server(tmp_path: Path) -> Iterator[Path]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("needs redis-server")
    sock = tmp_path / "redis.sock"
    proc = subprocess.Popen([binary, "--port", "0", "--unixsocket", str(sock), "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.05)
    try:
        yield sock
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.redis
async def test_a_unix_socket_url_with_a_db(unix_server: Path) -> None:
    client, batcher = await _batcher(f"unix://{unix_server}?db=1")
    try:
        replies: list[Any] = await batcher.submit([("SET", "conn:unix", "1"), ("CLIENT", "INFO")])
        assert replies[0] == b"OK"
        assert b" db=1 " in replies[1]
    finally:
        await _close(client, batcher)
