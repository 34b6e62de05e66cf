"""The Redis command batcher: every command queued in one event-loop tick goes out as one
pipeline, on a connection of its own whose replies are parsed as they arrive.

redis-py opens the connection (TLS, AUTH, SELECT, HELLO: everything its URL options say), then
the batcher takes the socket over with an ``asyncio.Protocol`` of its own. Pipelines are written
back to back without waiting for the previous one's replies; hiredis parses each chunk of replies
the moment it arrives and every caller's future is settled from that callback. Compared with
reading each reply through ``Connection.read_response`` from a flusher task, this saves a task
switch per pipeline and a coroutine per reply — most of what a checkpoint commit costs the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import hiredis
from redis import exceptions as redis_errors
from redis._parsers.base import BaseParser
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import InvalidResponse

from debatebus.exceptions import TransportError
from debatebus.transports.redis_common import Command, pack_commands, transport_error

__all__ = ["AckTarget", "Check", "CommandBatcher"]

#: What an acknowledgement needs: (stream, group, entry id).
AckTarget = tuple[str, str, str]
#: Turns a job's replies into its result, or raises (the error the job's caller then gets).
Check = Callable[[list[Any]], list[Any]]

_MORE = object()  # hiredis: not enough data for a whole reply yet


@dataclass(slots=True)
class _Job:
    commands: Sequence[Command]
    ack: AckTarget | None
    future: asyncio.Future[list[Any]]
    check: Check | None = None


@dataclass(slots=True)
class _Pipeline:
    """One pipeline on the wire: its jobs, the XACK owners, and the replies collected so far."""

    jobs: list[_Job]
    ack_owners: list[list[_Job]]
    expected: int
    replies: list[Any] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class _Wire(asyncio.Protocol):
    """A connection taken over from redis-py after its handshake: pipelines in, replies out, in
    order. ``on_done(pipeline, error)`` is called once per pipeline, from the loop."""

    def __init__(self, connection: AbstractConnection, transport: asyncio.Transport,
                 on_done: Callable[[_Pipeline, BaseException | None], None]) -> None:
        self.connection = connection
        self.transport = transport
        self.on_done = on_done
        self.inflight: deque[_Pipeline] = deque()
        self.lost: BaseException | None = None
        self.reader = hiredis.Reader(protocolError=InvalidResponse,
                                     replyError=BaseParser.parse_error, notEnoughData=_MORE)

    def send(self, pipeline: _Pipeline, payload: bytes) -> None:
        self.inflight.append(pipeline)
        self.transport.write(payload)

    def data_received(self, data: bytes) -> None:
        try:
            self.reader.feed(data)
            while (reply := self.reader.gets()) is not _MORE:
                pipeline = self.inflight[0]
                pipeline.replies.append(reply)
                if len(pipeline.replies) == pipeline.expected:
                    self.inflight.popleft()
                    self.on_done(pipeline, None)
        except Exception as e:  # garbage on the wire, or a reply nobody asked for
            self.fail(redis_errors.InvalidResponse(f"unexpected reply from Redis: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(redis_errors.ConnectionError(
            "Connection closed by server." if exc is None else f"Connection lost: {exc}"))

    def fail(self, error: BaseException) -> None:
        """Every pipeline without all its replies fails: the stream of replies can't be trusted."""
        if self.lost is None:
            self.lost = error
            self.transport.abort()
        while self.inflight:
            self.on_done(self.inflight.popleft(), self.lost)


class CommandBatcher:
    """Micro-batching: ``submit`` queues commands and waits; everything queued during the same
    loop tick is sent as one pipeline (one MULTI/EXEC when ``transaction``), with one ``XACK`` per
    stream and group for all the acknowledgements in it.

    Each caller gets the replies to its own commands, or a ``TransportError`` when they — or the
    ``XACK`` their acknowledgement rode on — failed, or the whole pipeline did. Redis does not roll
    back a transaction whose command fails at run time; the only such failure possible here is a
    ``WRONGTYPE`` (a topic name taken by a non-stream key), reported to the job it belongs to.
    A connection the server closes (a restart, an idle timeout) is replaced at the next pipeline;
    the pipelines it was carrying fail, since Redis may or may not have run them.
    """

    def __init__(self, client: Redis, where: str, *, transaction: bool, timeout: float) -> None:
        self._pool = client.connection_pool
        self._where = where
        self._transaction = transaction
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
        """Send what is queued, wait for its replies (at most ``timeout``), then let go of the
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
        await self._let_go()
        # What never reached Redis (a reconnect still pending, or no reply in time) fails: no
        # caller is left waiting on a batcher that is gone.
        unsent = [job for batch in self._waiting for job in batch] + self._queue
        self._waiting, self._queue = [], []
        for job in unsent:
            _fail(job, TransportError(f"the connection to Redis at {self._where} was closed "
                                      "before this command was sent"))

    async def submit(self, commands: Sequence[Command], ack: AckTarget | None = None) -> list[Any]:
        # A cancelled caller does not unqueue its job: half-settled states are worse than a late one.
        return await self.enqueue(commands, ack)

    def enqueue(self, commands: Sequence[Command], ack: AckTarget | None = None, *,
                check: Check | None = None) -> asyncio.Future[list[Any]]:
        """Queue now, await the replies later: jobs reach Redis in the order they were queued.
        ``check`` turns the replies into the result, or raises; it runs as the replies arrive,
        which spares the caller a hop through the event loop."""
        if not self._started or self._stopping:
            raise TransportError("the Redis transport is not connected: call connect() or use async with")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        self._queue.append(_Job(commands, ack, future, check))
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
        commands: list[Command] = [command for job in batch for command in job.commands]
        acks: dict[tuple[str, str], list[_Job]] = {}
        for job in batch:
            if job.ack is not None:
                acks.setdefault(job.ack[:2], []).append(job)
        for (stream, group), jobs in acks.items():
            commands.append(("XACK", stream, group, *[job.ack[2] for job in jobs if job.ack]))
        framed = [("MULTI",), *commands, ("EXEC",)] if self._transaction else commands
        pipeline = _Pipeline(batch, list(acks.values()), len(framed))
        try:
            payload = pack_commands(framed)
        except Exception as e:  # an argument Redis can't take (redis-py raises DataError too)
            self._done(pipeline, e)
            return
        pipeline.timer = asyncio.get_running_loop().call_later(self._timeout, self._timed_out, wire)
        wire.send(pipeline, payload)

    async def _reconnect(self) -> None:
        try:
            await self._let_go()
            try:
                self._wire = await self._take_over()
            except Exception as e:
                waiting, self._waiting = self._waiting, []
                for batch in waiting:
                    self._done(_Pipeline(batch, [], 0), e)
                return
            waiting, self._waiting = self._waiting, []
            for batch in waiting:
                self._send(self._wire, batch)
        finally:
            self._connecting = None
            if self._queue and not self._scheduled:  # queued while we connected
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)

    async def _take_over(self) -> _Wire:
        connection: AbstractConnection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        writer = getattr(connection, "_writer", None)
        if writer is None:
            await self._pool.release(connection)
            raise redis_errors.ConnectionError("redis-py gave a connection without a socket")
        wire = _Wire(connection, writer.transport, self._done)
        writer.transport.set_protocol(wire)
        return wire

    async def _let_go(self) -> None:
        """Hand a (closed) connection back to the pool, which reopens it when it is next used."""
        wire, self._wire = self._wire, None
        if wire is None:
            return
        wire.fail(redis_errors.ConnectionError("connection closed by the client"))
        with contextlib.suppress(Exception):
            await wire.connection.disconnect(nowait=True)
        with contextlib.suppress(Exception):
            await self._pool.release(wire.connection)

    def _timed_out(self, wire: _Wire) -> None:
        wire.fail(redis_errors.TimeoutError(f"no reply within {self._timeout:g} s"))

    # ---- settling ---------------------------------------------------------------------------

    def _done(self, pipeline: _Pipeline, error: BaseException | None) -> None:
        if pipeline.timer is not None:
            pipeline.timer.cancel()
        try:
            if error is not None:
                raise error
            replies = pipeline.replies
            if self._transaction:
                replies = _transaction_replies(replies, pipeline.expected - 2)
        except BaseException as e:  # whatever it is, every caller hears
            mapped = e if isinstance(e, TransportError) else transport_error(e, self._where)
            for job in pipeline.jobs:
                _fail(job, mapped)
        else:
            self._settle(pipeline.jobs, pipeline.ack_owners, replies)
        finally:
            wire = self._wire
            if not self._queue and not self._waiting and (wire is None or not wire.inflight):
                self._idle.set()

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
            elif job.future.done():
                continue
            elif job.check is None:
                job.future.set_result(mine)
            else:
                try:
                    job.future.set_result(job.check(mine))
                except Exception as e:
                    job.future.set_exception(e)


def _transaction_replies(replies: list[Any], count: int) -> list[Any]:
    """``+OK``, ``count`` × ``+QUEUED`` and the EXEC array → the EXEC array. A command refused
    while queueing aborts the whole transaction (EXECABORT), and its own error is the one worth
    raising."""
    refused = [r for r in replies[:-1] if isinstance(r, Exception)]
    executed = replies[-1]
    if isinstance(executed, redis_errors.ExecAbortError) or (
            isinstance(executed, redis_errors.ResponseError)
            and str(executed).startswith("EXECABORT")):
        raise refused[0] if refused else executed
    if isinstance(executed, Exception):
        raise executed
    if not isinstance(executed, list) or len(executed) != count:
        raise redis_errors.ResponseError(f"EXEC answered {executed!r} to {count} commands")
    return executed


def _fail(job: _Job, error: BaseException) -> None:
    if not job.future.done():
        job.future.set_exception(error)
