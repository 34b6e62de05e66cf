"""The Redis command batcher, a client of one server: every command queued in one event-loop tick
goes out as one pipeline, on a connection of its own (``_connection``) whose replies are parsed as
they arrive. The commands run one by one, never inside MULTI/EXEC: a caller whose commands must be
atomic sends a script (``_scripts``).

The batcher owns its connection outright: it opens the socket with asyncio (TCP, TLS or a unix
socket, as the client's URL says), authenticates (``AUTH``), selects the db (``SELECT``) and reads
the replies with hiredis's ``Reader`` — public APIs only; redis-py's own connections are never
touched, so the client and the batcher close in any order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from debatebus._redis.connection import Command, Endpoint, Pipeline, Wire, open_wire
from debatebus._redis.errors import transport_error
from debatebus.exceptions import ConfigError, DebatebusError, TransportError

T = TypeVar("T")
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

@dataclass(slots=True)
class _Job:
    commands: Sequence[Command]
    future: asyncio.Future[list[Any]]
    check: Check | None = None


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
    ``connection_kwargs`` and ``connection_class``). The client itself carries only what
    ``on_master`` is given, and is closed by ``stop`` only if ``owns_client``.
    """

    def __init__(self, client: Redis, where: str, *, timeout: float,
                 owns_client: bool = False) -> None:
        self._client = client
        self._owns_client = owns_client
        self._pool = client.connection_pool
        self._endpoint: Endpoint | None = None
        self._where = where
        self._timeout = timeout
        self._queue: list[_Job] = []
        self._scheduled = False
        self._started = False
        self._stopping = False
        self._wire: Wire | None = None
        #: Pipelines made while (re)connecting: sent, in order, once the connection is up.
        self._waiting: list[list[_Job]] = []
        self._connecting: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        #: Scripts being loaded (``load_script``), by their text.
        self._loading: dict[str, asyncio.Future[list[Any]]] = {}

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
        if self._owns_client:
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await self._client.aclose()
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

    async def on_master(self, key: str, call: Callable[[Redis], Awaitable[T]]) -> T:
        """``call`` on the client: what a pipeline of the batcher cannot carry (blocking reads,
        pub/sub, MULTI/EXEC), on the same server (``key``: the one it touches, for a cluster)."""
        return await call(self._client)

    async def load_script(self, text: str) -> None:
        """``SCRIPT LOAD`` ``text``. Callers while its load is in flight share it: after a Redis
        restart, the hundreds of commands of a burst that all found their script missing load
        it once, not once each."""
        loading = self._loading.get(text)
        if loading is None:
            loading = self._loading[text] = self.enqueue([("SCRIPT", "LOAD", text)])
            loading.add_done_callback(lambda _: self._loading.pop(text, None))
        await asyncio.shield(loading)

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

    def _send(self, wire: Wire, batch: list[_Job]) -> None:
        pipeline = Pipeline(batch, self._done)
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
                self._wire = await open_wire(self._endpoint, self._where)
            except Exception as e:  # nothing of what waits was written
                error = _not_sent(e, self._where)
                waiting, self._waiting = self._waiting, []
                for batch in waiting:
                    self._done(Pipeline(batch, self._done), error)
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

    def _timed_out(self, wire: Wire) -> None:
        wire.fail(redis_errors.TimeoutError(f"no reply within {self._timeout:g} s"))

    # ---- settling ---------------------------------------------------------------------------

    def _done(self, pipeline: Pipeline, error: BaseException | None) -> None:
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
