"""The Redis command batcher: every command queued in one event-loop tick goes out as one
pipeline, on a connection of its own whose replies are parsed as they arrive. The commands run
one by one, never inside MULTI/EXEC: a caller whose commands must be atomic sends a script.

The batcher owns its connection outright: it opens the socket with asyncio (TCP, TLS or a unix
socket, as the client's URL says), authenticates (``AUTH``), selects the db (``SELECT``) and reads
the replies with hiredis's ``Reader`` — public APIs only; redis-py's own connections are never
touched, so the client and the batcher close in any order.

**The connection speaks RESP2, whatever the URL says**: it never sends ``HELLO``, so
``?protocol=3`` applies to the client's connections, not to this one, and no RESP3 push frame can
arrive on it. As a defence all the same, every pipeline ends with ``ECHO <token>``: a pipeline is
complete only once its last reply is its own token, so a frame nobody asked for (which would shift
every later reply by one) fails the pipelines in flight and closes the connection instead of
handing one caller another's reply. (So the Redis user needs ``ECHO``, which ``+@all`` and
``+@connection`` include.)

Pipelines are written back to back without waiting for the previous one's replies; hiredis parses
each chunk of replies the moment it arrives and every caller's future is resolved from that
callback, which spares a task switch per pipeline and a coroutine per reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import hiredis
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from debatebus.exceptions import ConfigError, DebatebusError, TransportError
from debatebus.transports.redis_common import Command, pack_commands, transport_error
from debatebus.transports.redis_endpoint import Endpoint, reply_error

__all__ = ["Check", "CommandBatcher", "NotSentError"]

#: Turns a job's replies into its result, or raises (the error the job's caller then gets).
Check = Callable[[list[Any]], list[Any]]


class NotSentError(TransportError):
    """The commands never left: no connection to Redis could be opened (refused, unreachable, a
    handshake that failed), or the batcher was stopped before they were written. Redis did not
    run them, so sending them again — to this server later, or to another master of a cluster —
    cannot run them twice, whatever they are. (A command that was written and whose reply never
    came fails with a plain ``TransportError``: it may have run.)"""


def _not_sent(error: Exception, where: str) -> DebatebusError:
    """What the callers of commands that never left hear when no connection could be opened: a
    ``ConfigError`` as is (refused credentials: sending again cannot help), else a
    ``NotSentError`` saying why, the original as its cause."""
    mapped = error if isinstance(error, DebatebusError) else transport_error(error, where)
    if isinstance(mapped, ConfigError):
        return mapped
    out = NotSentError(str(mapped))
    out.__cause__ = mapped.__cause__ or error
    return out

_MORE = object()  # hiredis: not enough data for a whole reply yet

# ---- the wire ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Job:
    commands: Sequence[Command]
    future: asyncio.Future[list[Any]]
    check: Check | None = None


@dataclass(slots=True, eq=False)
class _Pipeline:
    """One pipeline on the wire: its jobs and the replies collected so far.
    ``resolve(pipeline, error)`` is called once, from the loop, when it ends either way."""

    jobs: list[_Job]
    resolve: Callable[[_Pipeline, BaseException | None], None]
    expected: int = 0
    marker: bytes = b""
    replies: list[Any] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class _Wire(asyncio.Protocol):
    """The batcher's own connection: pipelines in, replies out, in order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.inflight: deque[_Pipeline] = deque()
        self.lost: BaseException | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sent = 0
        self.reader = hiredis.Reader(protocolError=redis_errors.InvalidResponse,
                                     replyError=reply_error, notEnoughData=_MORE)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def send(self, pipeline: _Pipeline, commands: Sequence[Command]) -> None:
        """Writes ``commands`` then this pipeline's ``ECHO`` marker (``pack_commands`` errors
        propagate: nothing is written then)."""
        self.sent += 1
        marker = b"debatebus:%d" % self.sent
        payload = pack_commands(itertools.chain(commands, (("ECHO", marker),)))
        assert self.transport is not None and self.lost is None
        pipeline.expected, pipeline.marker = len(commands) + 1, marker
        self.inflight.append(pipeline)
        self.transport.write(payload)

    def data_received(self, data: bytes) -> None:
        if self.lost is not None:
            return
        try:
            self.reader.feed(data)
            while (reply := self.reader.gets()) is not _MORE:
                self._take(reply)
        except Exception as e:  # garbage on the wire, or a reply nobody asked for
            self.fail(e)

    def _take(self, reply: Any) -> None:
        if not self.inflight:
            raise redis_errors.InvalidResponse(f"Redis sent {reply!r} while no command was waiting")
        pipeline = self.inflight[0]
        pipeline.replies.append(reply)
        if len(pipeline.replies) < pipeline.expected:
            return
        if isinstance(reply, redis_errors.RedisError):  # ECHO refused (NOAUTH, NOPERM): the
            raise reply                                # replies can't be checked, so none count
        if reply != pipeline.marker:  # some frame in between was no reply to ours: all shifted
            raise redis_errors.InvalidResponse("Redis sent more replies than commands: a frame "
                                               "that answers none of them came in between")
        pipeline.replies.pop()
        self.inflight.popleft()
        pipeline.resolve(pipeline, None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(redis_errors.ConnectionError(
            "Connection closed by server." if exc is None else f"Connection lost: {exc}"))
        if not self.closed.done():
            self.closed.set_result(None)

    def fail(self, error: BaseException) -> None:
        """Every pipeline without all its replies fails: the stream of replies can't be trusted."""
        if self.lost is None:
            self.lost = error
            if self.transport is not None:
                self.transport.abort()
        while self.inflight:
            pipeline = self.inflight.popleft()
            pipeline.resolve(pipeline, self.lost)


async def _open(endpoint: Endpoint, where: str) -> _Wire:
    """A new connection, handshake done, within the endpoint's connect timeout."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(endpoint.connect_timeout):
        if endpoint.path is not None:
            _, wire = await loop.create_unix_connection(_Wire, endpoint.path)
        else:
            _, wire = await loop.create_connection(
                _Wire, endpoint.host, endpoint.port, ssl=endpoint.tls,
                server_hostname=endpoint.host if endpoint.tls is not None else None)
        try:
            if endpoint.keepalive and endpoint.path is None and wire.transport is not None:
                sock = wire.transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            await _handshake(wire, endpoint.handshake(), where)
        except BaseException:
            wire.fail(redis_errors.ConnectionError("handshake failed"))
            raise
    return wire


async def _handshake(wire: _Wire, commands: list[Command], where: str) -> None:
    if not commands:
        return
    done: asyncio.Future[tuple[list[Any], BaseException | None]] = (
        asyncio.get_running_loop().create_future())

    def resolve(pipeline: _Pipeline, error: BaseException | None) -> None:
        if not done.done():
            done.set_result((pipeline.replies, error))

    wire.send(_Pipeline([], resolve), commands)
    replies, error = await done
    # A refused AUTH makes every later reply a NOAUTH: the first refusal is the one to report.
    for command, reply in zip(commands, replies, strict=False):
        if not isinstance(reply, Exception):
            continue
        if command[0] == "SELECT" and isinstance(reply, redis_errors.ResponseError):
            raise ConfigError(f"Redis at {where} refused to select db {command[1]}: check the db "
                              f"number in the URL ({reply})") from reply
        raise transport_error(reply, where)  # refused credentials: a ConfigError
    if error is not None:
        raise error


# ---- the batcher ------------------------------------------------------------------------------


class CommandBatcher:
    """Micro-batching: ``submit`` queues commands and waits; everything queued during the same
    loop tick is sent as one pipeline.

    Each caller gets the replies to its own commands (or what its ``check`` makes of them), or a
    ``TransportError`` when one of its commands failed — the other jobs in the pipeline are not
    affected — or the whole pipeline did (a ``ConfigError`` when Redis refuses the credentials).
    A connection that is lost, or that stays silent for ``timeout`` seconds, is closed and
    replaced at the next pipeline; the pipelines it was carrying fail, since Redis may or may not
    have run them. Jobs that never left (no connection could be opened, or the batcher stopped
    first) fail with ``NotSentError``: Redis did not run them.

    The connection is the batcher's own, made from ``client``'s settings (``connection_pool``'s
    ``connection_kwargs`` and ``connection_class``); the client itself is never used or closed.
    """

    def __init__(self, client: Redis, where: str, *, timeout: float) -> None:
        self._pool = client.connection_pool
        self._endpoint: Endpoint | None = None
        self._where = where
        self._timeout = timeout
        self._queue: list[_Job] = []
        self._scheduled = False
        self._started = False
        self._stopping = False
        self._wire: _Wire | None = None
        #: Pipelines made while (re)connecting: sent, in order, once the connection is up.
        self._waiting: list[list[_Job]] = []
        self._connecting: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self) -> None:
        self._started, self._stopping = True, False

    async def stop(self) -> None:
        """Send what is queued, wait for its replies (at most ``timeout``), then close the
        connection."""
        if not self._started:
            return
        self._stopping = True
        self._flush()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), self._timeout)
        self._started = False
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._connecting
        await self._close()
        # What never reached Redis (a reconnect still pending, or no reply in time) fails: no
        # caller is left waiting on a batcher that is gone.
        unsent = [job for batch in self._waiting for job in batch] + self._queue
        self._waiting, self._queue = [], []
        for job in unsent:
            _fail(job, NotSentError(f"the connection to Redis at {self._where} was closed "
                                    "before this command was sent"))

    async def submit(self, commands: Sequence[Command]) -> list[Any]:
        # A cancelled caller does not unqueue its job: half-resolved states are worse than a late one.
        return await self.enqueue(commands)

    def enqueue(self, commands: Sequence[Command], *,
                check: Check | None = None) -> asyncio.Future[list[Any]]:
        """Queue now, await the replies later: jobs reach Redis in the order they were queued.
        ``check`` turns the replies into the result, or raises; it runs as the replies arrive,
        which spares the caller a hop through the event loop."""
        if not self._started or self._stopping:
            raise TransportError("the Redis transport is not connected: call connect() or use async with")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        self._queue.append(_Job(commands, future, check))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    # ---- sending ----------------------------------------------------------------------------

    def _flush(self) -> None:
        self._scheduled = False
        if not self._queue:
            return
        if not self._started:  # stopped while a reconnect was pending: stop() fails these
            return
        batch, self._queue = self._queue, []
        self._idle.clear()
        wire = self._wire
        if wire is None or wire.lost is not None or self._connecting is not None:
            self._waiting.append(batch)
            if self._connecting is None:
                self._connecting = asyncio.create_task(self._reconnect())
            return
        self._send(wire, batch)

    def _send(self, wire: _Wire, batch: list[_Job]) -> None:
        pipeline = _Pipeline(batch, self._done)
        try:
            wire.send(pipeline, [command for job in batch for command in job.commands])
        except Exception as e:  # an argument Redis can't take: nothing was sent
            self._done(pipeline, e)
            return
        pipeline.timer = asyncio.get_running_loop().call_later(self._timeout, self._timed_out, wire)

    async def _reconnect(self) -> None:
        try:
            await self._close()
            try:
                if self._endpoint is None:
                    self._endpoint = Endpoint.of(self._pool, self._timeout)
                self._wire = await _open(self._endpoint, self._where)
            except Exception as e:  # nothing of what waits was written
                error = _not_sent(e, self._where)
                waiting, self._waiting = self._waiting, []
                for batch in waiting:
                    self._done(_Pipeline(batch, self._done), error)
                return
            waiting, self._waiting = self._waiting, []
            for batch in waiting:
                self._send(self._wire, batch)
        finally:
            self._connecting = None
            if self._queue and not self._scheduled:  # queued while we connected
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)

    async def _close(self) -> None:
        """Close the connection (failing what it still carries) and wait, briefly, until it is."""
        wire, self._wire = self._wire, None
        if wire is None:
            return
        wire.fail(redis_errors.ConnectionError("connection closed by the client"))
        await asyncio.wait([wire.closed], timeout=1.0)

    def _timed_out(self, wire: _Wire) -> None:
        wire.fail(redis_errors.TimeoutError(f"no reply within {self._timeout:g} s"))

    # ---- settling ---------------------------------------------------------------------------

    def _done(self, pipeline: _Pipeline, error: BaseException | None) -> None:
        if pipeline.timer is not None:
            pipeline.timer.cancel()
        try:
            if error is None:
                self._resolve(pipeline.jobs, pipeline.replies)
            else:  # whatever it is, every caller hears
                mapped = (error if isinstance(error, DebatebusError)
                          else transport_error(error, self._where))
                for job in pipeline.jobs:
                    _fail(job, mapped)
        finally:
            wire = self._wire
            if not self._queue and not self._waiting and (wire is None or not wire.inflight):
                self._idle.set()

    def _resolve(self, batch: list[_Job], replies: list[Any]) -> None:
        # Replies come in queue order: each job's own commands, one after another.
        start = 0
        for job in batch:
            mine = replies[start:start + len(job.commands)]
            start += len(job.commands)
            failed = next((r for r in mine if isinstance(r, Exception)), None)
            if failed is not None:
                _fail(job, transport_error(failed, self._where))
            elif job.future.done():
                continue
            elif job.check is None:
                job.future.set_result(mine)
            else:
                try:
                    job.future.set_result(job.check(mine))
                except Exception as e:
                    job.future.set_exception(e)


def _fail(job: _Job, error: BaseException) -> None:
    if not job.future.done():
        job.future.set_exception(error)
