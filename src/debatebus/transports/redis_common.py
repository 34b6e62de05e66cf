"""What both Redis transports share: the client builder, the redis→TransportError mapping, and the
batcher that sends every command queued in one event-loop tick as a single pipeline.

Timeouts: clients are built without a per-read socket timeout (redis-py would arm one for every
reply of a pipeline); each call is bounded as a whole instead (``redis_call``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import DataError

from debatebus.exceptions import ConfigError, TransportError

try:
    import hiredis

    _pack: Any = hiredis.pack_command
except ImportError:  # hiredis is optional (the redis extra brings it): fall back to redis-py's packer
    _pack = None

__all__ = [
    "NO_HEADERS",
    "CommandBatcher",
    "ReadTracker",
    "build_client",
    "describe",
    "map_redis_errors",
    "pack_commands",
    "redis_call",
]

log = logging.getLogger("debatebus.transports.redis")

#: Shared by every delivery without headers: one less dict per message.
NO_HEADERS: Mapping[str, str] = MappingProxyType({})
#: A command as its arguments: ``("XADD", stream, "*", field, value…)``; str, bytes or int.
Command = tuple[Any, ...]
#: What an acknowledgement needs: (stream, group, entry id).
AckTarget = tuple[str, str, str]


class _HiredisPacking:
    """Packs commands with hiredis's C packer: redis-py's asyncio connections use a pure-Python
    packer that costs ~3× more per command, which shows on a bus doing thousands per second."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str) and " " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [_pack(tuple(
                bytes(a) if isinstance(a, bytearray | memoryview) else a for a in args))]
        except TypeError as exc:
            raise DataError(str(exc)) from exc


class _FastConnection(_HiredisPacking, Connection):
    pass


class _FastSSLConnection(_HiredisPacking, SSLConnection):
    pass


class _FastUnixConnection(_HiredisPacking, UnixDomainSocketConnection):
    pass


_FAST = {Connection: _FastConnection, SSLConnection: _FastSSLConnection,
         UnixDomainSocketConnection: _FastUnixConnection}


def _use_hiredis_packing(client: Redis) -> None:
    pool = client.connection_pool
    fast = _FAST.get(pool.connection_class) if _pack is not None else None
    if fast is not None:
        pool.connection_class = fast


def build_client(url: str, *, connect_timeout: float) -> Redis:
    """A client for ``url`` with bytes replies (bodies are never decoded) and short retries, so an
    unreachable broker fails in about a second, not after redis-py's default backoff (~7 s)."""
    try:
        client = Redis.from_url(
            url,
            decode_responses=False,
            socket_connect_timeout=connect_timeout,
            socket_timeout=None,
            socket_keepalive=True,
            retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries=2),
        )
    except ValueError as e:
        raise ConfigError(f"invalid Redis URL {url!r}: {e}") from e
    _use_hiredis_packing(client)
    return client


def check_client(client: Redis) -> None:
    """A caller-supplied client must hand back bytes: bodies are opaque and never decoded."""
    if client.get_encoder().decode_responses:  # type: ignore[no-untyped-call]
        raise ConfigError("pass a redis.asyncio.Redis built with decode_responses=False")


def describe(url: str | None, client: Redis | None = None) -> str:
    """``host:port`` for messages, never the password in the URL."""
    if client is not None:
        kwargs = client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return str(kwargs["path"])
        return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    parts = urlsplit(url or "")
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"


def _explain(error: BaseException, where: str) -> str:
    cause = f"({type(error).__name__}: {error})"
    if isinstance(error, redis_errors.AuthenticationError | redis_errors.AuthorizationError):
        return f"Redis at {where} refused the credentials: check user and password in the URL {cause}"
    if isinstance(error, redis_errors.TimeoutError | TimeoutError):
        return (f"Redis at {where} did not answer in time: check the server's load and the network,"
                f" or raise connect_timeout/command_timeout {cause}")
    if isinstance(error, redis_errors.ConnectionError | OSError):
        return f"cannot reach Redis at {where}: is redis-server running there? {cause}"
    if isinstance(error, redis_errors.ReadOnlyError):
        return f"Redis at {where} is a read-only replica: point the URL at the primary {cause}"
    if isinstance(error, redis_errors.ResponseError) and str(error).startswith("WRONGTYPE"):
        return (f"Redis at {where}: a topic name is already used by a key that is not a stream;"
                f" rename the topic or delete that key {cause}")
    if isinstance(error, redis_errors.ResponseError) and str(error).startswith("NOGROUP"):
        return (f"Redis at {where}: the stream or its consumer group is gone (deleted while in"
                f" use?); consuming again recreates them {cause}")
    if isinstance(error, redis_errors.ResponseError):
        return (f"Redis at {where} rejected a command: check the server version (Streams consumer"
                f" groups need Redis >= 6.2) and its memory limit {cause}")
    return f"Redis at {where} failed: {cause}"


def transport_error(error: BaseException, where: str) -> TransportError:
    mapped = TransportError(_explain(error, where))
    mapped.__cause__ = error
    return mapped


@contextlib.contextmanager
def map_redis_errors(where: str) -> Iterator[None]:
    """Re-raise every redis-py (and socket) error as ``TransportError``, the original as cause."""
    try:
        yield
    except (redis_errors.RedisError, OSError) as e:
        raise transport_error(e, where) from e


@contextlib.asynccontextmanager
async def redis_call(where: str, timeout: float) -> AsyncIterator[None]:
    """A Redis call bounded by ``timeout`` seconds, its errors mapped to ``TransportError``."""
    with map_redis_errors(where):
        async with asyncio.timeout(timeout):
            yield


def _bulk(arg: Any) -> bytes:
    if isinstance(arg, bytes | bytearray | memoryview):
        return bytes(arg)  # no copy for bytes itself
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, int):
        return b"%d" % arg
    return str(arg).encode()


def _packed(command: Command) -> bytes:
    try:
        return bytes(_pack(tuple(command)))
    except TypeError:  # hiredis takes no bytearray: copy those (rare) arguments
        return bytes(_pack(tuple(bytes(a) if isinstance(a, bytearray) else a for a in command)))


def pack_commands(commands: Iterable[Command]) -> bytes:
    """RESP-encode ``commands`` into one buffer: what redis-py's packer does, without its per-
    argument encoder lookups, which cost more than the network here (hiredis's C packer when it
    is installed, a Python one otherwise)."""
    if _pack is not None:
        return b"".join([_packed(command) for command in commands])
    out = bytearray()
    for command in commands:
        out += b"*%d\r\n" % len(command)
        for arg in command:
            data = _bulk(arg)
            out += b"$%d\r\n" % len(data)
            out += data
            out += b"\r\n"
    return bytes(out)


class ReadTracker:
    """Counts blocking reads in flight, so ``close()`` lets them return before it closes the pool:
    a pool closed under a read makes redis-py's retry reconnect a socket that nobody closes."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        self._count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._count -= 1
            if not self._count:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)


@dataclass(slots=True)
class _Job:
    commands: Sequence[Command]
    ack: AckTarget | None
    future: asyncio.Future[list[Any]]


class CommandBatcher:
    """Micro-batching: ``submit`` queues commands and waits; one flusher task sends everything
    queued during the same loop tick as one pipeline (one MULTI/EXEC when ``transaction``), with
    one ``XACK`` per stream and group for all the acknowledgements in it.

    Each caller gets the replies to its own commands, or a ``TransportError`` when they — or the
    ``XACK`` their acknowledgement rode on — failed, or the whole pipeline did. Redis does not roll
    back a transaction whose command fails at run time; the only such failure possible here is a
    ``WRONGTYPE`` (a topic name taken by a non-stream key), reported to the job it belongs to.
    """

    def __init__(self, client: Redis, where: str, *, transaction: bool, timeout: float) -> None:
        self._pool = client.connection_pool
        self._where = where
        self._transaction = transaction
        self._timeout = timeout
        self._queue: list[_Job] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._run(), name="debatebus-redis-flusher")

    async def stop(self) -> None:
        """Flush what is queued, then end the flusher."""
        if self._task is None:
            return
        self._stopping = True
        self._wake.set()
        task, self._task = self._task, None
        await task

    async def submit(self, commands: Sequence[Command], ack: AckTarget | None = None) -> list[Any]:
        if self._task is None or self._stopping:
            raise TransportError("the Redis transport is not connected: call connect() or use async with")
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Job(commands, ack, future))
        self._wake.set()
        # A cancelled caller does not unqueue its job: half-settled states are worse than a late one.
        return await future

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._queue:
                batch, self._queue = self._queue, []
                await self._flush(batch)
            elif self._stopping:
                return

    async def _flush(self, batch: list[_Job]) -> None:
        commands: list[Command] = [command for job in batch for command in job.commands]
        acks: dict[tuple[str, str], list[_Job]] = {}
        for job in batch:
            if job.ack is not None:
                acks.setdefault(job.ack[:2], []).append(job)
        for (stream, group), jobs in acks.items():
            commands.append(("XACK", stream, group, *[job.ack[2] for job in jobs if job.ack]))
        try:
            async with redis_call(self._where, self._timeout):
                replies = await self._round_trip(commands)
        except Exception as e:  # whatever it is, the flusher must live on and every caller hear
            for job in batch:
                _fail(job, e)
            return
        self._settle(batch, list(acks.values()), replies)

    async def _round_trip(self, commands: list[Command]) -> list[Any]:
        framed = [("MULTI",), *commands, ("EXEC",)] if self._transaction else commands
        payload = pack_commands(framed)
        try:
            return await self._exchange(payload, len(commands))
        except redis_errors.ConnectionError:
            # A pooled connection the server closed (a restart, an idle timeout) fails on first
            # use. Retry once on a fresh one, as redis-py does for its own commands; a reply lost
            # after the server ran the commands makes them run twice, which every caller
            # tolerates (results are published at least once; checkpoint restore skips a
            # repeated round).
            return await self._exchange(payload, len(commands))

    async def _exchange(self, payload: bytes, count: int) -> list[Any]:
        connection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await connection.send_packed_command(payload, check_health=False)
            if self._transaction:
                return await _read_transaction(connection, count)
            return [await _read_reply(connection) for _ in range(count)]
        except BaseException:
            # A reply stream read halfway cannot serve the next caller.
            await connection.disconnect()
            raise
        finally:
            await self._pool.release(connection)

    def _settle(self, batch: list[_Job], ack_owners: list[list[_Job]], replies: list[Any]) -> None:
        # Replies come in queue order: each job's own commands, then one XACK per (stream, group).
        for jobs, reply in zip(ack_owners, replies[len(replies) - len(ack_owners):], strict=True):
            if isinstance(reply, Exception):
                for job in jobs:
                    _fail(job, transport_error(reply, self._where))
        start = 0
        for job in batch:
            mine = replies[start:start + len(job.commands)]
            start += len(job.commands)
            failed = next((r for r in mine if isinstance(r, Exception)), None)
            if failed is not None:
                _fail(job, transport_error(failed, self._where))
            elif not job.future.done():
                job.future.set_result(mine)


async def _read_reply(connection: AbstractConnection) -> Any:
    try:
        return await connection.read_response()
    except redis_errors.ResponseError as e:  # one command's failure, not the connection's
        return e


async def _read_transaction(connection: AbstractConnection, count: int) -> list[Any]:
    """Read ``+OK``, ``count`` × ``+QUEUED`` and the EXEC array; a command refused while queueing
    aborts the whole transaction (EXECABORT), and its own error is the one worth raising."""
    refused = [r for r in [await _read_reply(connection) for _ in range(count + 1)]
               if isinstance(r, Exception)]
    try:
        replies = await connection.read_response()
    except redis_errors.ExecAbortError:
        if refused:
            raise refused[0] from None
        raise
    if not isinstance(replies, list) or len(replies) != count:
        raise redis_errors.ResponseError(f"EXEC answered {replies!r} to {count} commands")
    return replies


def _fail(job: _Job, error: BaseException) -> None:
    if not job.future.done():
        job.future.set_exception(error)
