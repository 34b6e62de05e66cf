"""Redis Cluster (``?cluster=true`` on any Redis URL): where a topic's stream lives, and the batcher
that sends each command to the master owning its slot.

**Keys.** A script or transaction may only touch keys of one hash slot, and the settle script
touches a request stream and its result (or dead-letter) streams together. So on a cluster a
topic's stream key carries its *family* as hash tag (``cluster_key``): the topic with every
``event:…:completed`` / ``event:…:failed`` wrapper and ``:dlq`` suffix peeled off.

* ``debate:request`` → ``{debate:request}``;
* ``event:debate:request:completed`` → ``event:{debate:request}:completed``;
* ``debate:request:dlq`` → ``{debate:request}:dlq``;
* ``event:debate:request:completed:dlq`` → ``event:{debate:request}:completed:dlq``;
* a topic with a non-empty ``{…}`` of its own (``orders:{eu}:new``) is kept as is.

A chained consumer reading ``event:debate:request:completed`` as its request stream settles into
``event:event:debate:request:completed:completed``: the same family, the same slot. Single-node
Redis keeps the topic as the key (no braces).

**Routing.** ``ClusterBatcher`` keeps the slot → master map (``CLUSTER SLOTS``, read on one of its
own connections) and one ``CommandBatcher`` per master, so commands still go out one pipeline per
master per loop tick. Each command of a job is routed on its own (by its first key: ``KEYS[1]``
of a script, the channel of ``PUBLISH``); the commands a job sends to one master keep their order,
commands on different masters run concurrently, and a redirected command is sent again after the
job's others (so a job whose commands must stay in order sends a script, as on one node).
``MOVED`` (the command did not run) updates the slot, schedules a refresh of the whole map and
sends the command again (the owners ``MOVED`` replies told since a refresh was scheduled win over
its reply, which may predate them); ``ASK`` sends ``ASKING`` and the command to the importing
master; ``TRYAGAIN`` (a multi-key command during a migration) and ``CLUSTERDOWN`` are retried
after a short pause. Past ``_MAX_REDIRECTS`` the caller gets the error. A lost connection fails
what it carried (as on one node) and refreshes the map.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from redis import exceptions as redis_errors
from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.connection import Connection
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from debatebus.exceptions import ConfigError, DebatebusError, TransportError
from debatebus.transports.redis_common import Command, RedisClient, is_cluster, transport_error
from debatebus.transports.redis_pipeline import Check, CommandBatcher

__all__ = [
    "Batcher",
    "ClusterBatcher",
    "SlotReads",
    "by_slot",
    "check_one_slot",
    "cluster_key",
    "command_slot",
    "evalsha",
    "make_batcher",
    "stream_key_rule",
]

T = TypeVar("T")
_MAX_REDIRECTS = 16
_RETRY_PAUSE_S = 0.05
_RESULTS = (":completed", ":failed")


@functools.lru_cache(maxsize=4096)
def cluster_key(topic: str) -> str:
    """The stream key of ``topic`` on a Redis Cluster (see the module docstring)."""
    opening = topic.find("{")
    if opening >= 0 and topic.find("}", opening + 1) > opening + 1:  # Redis's rule: the first
        return topic                                                  # '{', the next '}', not empty
    start, end = 0, len(topic)
    while True:
        if topic.endswith(":dlq", start, end) and end - 4 > start:
            end -= 4
            continue
        suffix = next((s for s in _RESULTS if topic.endswith(s, start, end)), None)
        if (suffix is not None and topic.startswith("event:", start, end)
                and end - len(suffix) > start + 6):
            start, end = start + 6, end - len(suffix)
            continue
        return f"{topic[:start]}{{{topic[start:end]}}}{topic[end:]}"


def _as_is(topic: str) -> str:
    return topic


def stream_key_rule(cluster: bool) -> Callable[[str], str]:
    """The topic → stream key rule: ``cluster_key`` on a cluster, the topic itself otherwise."""
    return cluster_key if cluster else _as_is


def check_one_slot(keys: Sequence[str], what: str) -> None:
    """A ``ConfigError`` unless ``keys`` share one hash slot, as one script's keys must: Redis
    would refuse the script (``CROSSSLOT``) however often it is retried."""
    slots = {key_slot(key.encode()) for key in keys}
    if len(slots) > 1:
        raise ConfigError(f"on a Redis Cluster, {what} must stay in one family (one hash slot), "
                          f"but {', '.join(keys)} are in {len(slots)}: see redis_cluster.cluster_key")


def by_slot(items: Sequence[T], key: Callable[[T], str]) -> list[list[T]]:
    """``items`` by the hash slot of their key, in first-seen order: what one multi-key command
    (XREADGROUP, XREAD) may name together on a cluster."""
    slots: dict[int, list[T]] = {}
    for item in items:
        slots.setdefault(key_slot(key(item).encode()), []).append(item)
    return list(slots.values())


class SlotReads(Generic[T]):
    """Blocking reads, one per slot, run at once: ``next`` waits for the first answer, and a read
    still running when it returns is kept running for the next call. Nothing a read got is
    dropped: when a read fails, its error is raised at once and what the reads that ended with
    it got is the next call's answer; ``stop`` hands back what nobody took."""

    def __init__(self, reads: Sequence[Callable[[], Awaitable[list[T]]]]) -> None:
        self._reads = reads
        self._running: dict[int, asyncio.Future[list[T]]] = {}
        self._ready: list[T] = []  # got by reads that ended with a failed one

    async def next(self) -> list[T]:
        if self._ready:
            out, self._ready = self._ready, []
            return out
        for n, read in enumerate(self._reads):
            if n not in self._running:
                self._running[n] = asyncio.ensure_future(read())
        await asyncio.wait(self._running.values(), return_when=asyncio.FIRST_COMPLETED)
        out = []
        error: BaseException | None = None
        for n, task in list(self._running.items()):
            if task.done():
                del self._running[n]  # run again at the next call, failed or not
                if task.exception() is None:
                    out += task.result()
                else:  # two reads failing in the same round: the first one's error is raised
                    error = error or task.exception()
        if error is not None:
            self._ready = out
            raise error
        return out

    def stop(self) -> list[T]:
        """Cancel the reads still running; what the finished ones got, never handed out."""
        out, self._ready = self._ready, []
        for task in self._running.values():
            if task.done() and not task.cancelled() and task.exception() is None:
                out += task.result()
            task.cancel()
        self._running.clear()
        return out


def command_slot(command: Command) -> int:
    """The slot a command is routed by: a script's first key, else its first argument."""
    name = command[0]
    if name in ("EVALSHA", "EVAL", "evalsha", "eval"):
        key = command[3] if int(command[2]) > 0 else b""
    else:
        key = command[1]
    return key_slot(key.encode() if isinstance(key, str) else bytes(key))


class Batcher(Protocol):
    """What the Redis transports and the checkpoint store need of a batcher: a
    ``CommandBatcher`` on one server, a ``ClusterBatcher`` on a cluster."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def submit(self, commands: Sequence[Command]) -> list[Any]: ...

    def enqueue(self, commands: Sequence[Command], *,
                check: Check | None = None) -> asyncio.Future[list[Any]]: ...


async def evalsha(batch: Batcher, command: Command,
                  load: Callable[[], Awaitable[None]]) -> Any:
    """The reply to one ``EVALSHA`` ``command``, pipelined by ``batch``. A Redis that forgot the
    script (it restarted) gets it from ``load`` (a ``SharedCall``: the burst of commands that
    found it missing loads it once), and the command again."""
    try:
        [reply] = await batch.submit([command])
    except TransportError as exc:
        if not isinstance(exc.__cause__, redis_errors.NoScriptError):
            raise
        await load()
        [reply] = await batch.submit([command])
    return reply


def make_batcher(client: RedisClient, where: str, *, timeout: float) -> Batcher:
    """The batcher for ``client``: one connection, or one per master of a cluster."""
    if is_cluster(client):
        return ClusterBatcher(client, where, timeout=timeout)
    return CommandBatcher(cast(Redis, client), where, timeout=timeout)


@dataclass(slots=True, eq=False)
class _Job:
    future: asyncio.Future[list[Any]]
    replies: list[Any]
    left: int
    check: Check | None

    def put(self, index: int, reply: Any) -> None:
        self.replies[index] = reply
        self.left -= 1
        if self.left or self.future.done():
            return
        if self.check is None:
            self.future.set_result(self.replies)
            return
        try:
            self.future.set_result(self.check(self.replies))
        except Exception as e:
            self.future.set_exception(e)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


@dataclass(slots=True, eq=False)
class _Call:
    """One command of a job, on its way to a master."""

    job: _Job
    index: int
    command: Command
    redirects: int = 0
    asking: str | None = None  # the master an ASK sent us to
    node: str = ""  # where it was sent last


class ClusterBatcher:
    """Routes every command to the master of its slot, through one ``CommandBatcher`` per master
    (see the module docstring). Same interface and failure rules as ``CommandBatcher``."""

    def __init__(self, client: RedisCluster, where: str, *, timeout: float) -> None:
        self._client = client
        self._where = where
        self._timeout = timeout
        self._slots: list[str | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        self._nodes: dict[str, CommandBatcher] = {}
        self._parked: list[_Call] = []  # waiting for the slot map
        self._refreshing: asyncio.Task[None] | None = None
        #: Owners told by MOVED replies since the running refresh was scheduled: they win over
        #: its reply, which may predate them (or come from a node that has not heard yet).
        self._moved: dict[int, str] = {}
        self._started = False

    def start(self) -> None:
        self._started = True

    async def stop(self) -> None:
        self._started = False
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._refreshing
        parked, self._parked = self._parked, []
        for call in parked:
            call.job.fail(TransportError(f"the connection to Redis at {self._where} was closed "
                                         "before this command was sent"))
        nodes, self._nodes = list(self._nodes.values()), {}
        await asyncio.gather(*(node.stop() for node in nodes))

    async def submit(self, commands: Sequence[Command]) -> list[Any]:
        return await self.enqueue(commands)

    def enqueue(self, commands: Sequence[Command], *,
                check: Check | None = None) -> asyncio.Future[list[Any]]:
        if not self._started:
            raise TransportError("the Redis transport is not connected: call connect() or use async with")
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        job = _Job(future, [None] * len(commands), len(commands), check)
        if not commands:
            future.set_result([])
        for index, command in enumerate(commands):
            self._route(_Call(job, index, command))
        return future

    # ---- routing ------------------------------------------------------------------------------

    def _route(self, call: _Call) -> None:
        if call.job.future.done():
            return
        try:
            node = call.asking or self._slots[command_slot(call.command)]
        except (TypeError, ValueError, IndexError) as e:  # no key to route by
            call.job.fail(TransportError(f"cannot route {call.command[0]!r} on a Redis Cluster: "
                                         f"{e}"))
            return
        if not self._started:  # stopped while the command was redirected
            call.job.fail(TransportError(f"the connection to Redis at {self._where} was closed "
                                         "before this command was sent"))
            return
        if node is None:
            self._parked.append(call)
            self._refresh_soon()
            return
        call.node = node
        commands = (("ASKING",), call.command) if call.asking else (call.command,)
        try:
            sent = self._node(node).enqueue(commands)
        except DebatebusError as e:
            call.job.fail(e)
            return
        sent.add_done_callback(functools.partial(self._landed, call))

    def _landed(self, call: _Call, sent: asyncio.Future[list[Any]]) -> None:
        if call.job.future.done():
            return
        error = sent.exception() if not sent.cancelled() else TransportError("cancelled")
        if error is None:
            call.job.put(call.index, sent.result()[-1])
            return
        cause = error.__cause__
        text = str(cause) if isinstance(cause, redis_errors.ResponseError) else ""
        if call.redirects >= _MAX_REDIRECTS:
            call.job.fail(error)
            return
        call.redirects += 1
        if text.startswith(("MOVED ", "ASK ")):
            kind, slot, address = text.split()[:3]
            if address.startswith(":"):  # the node did not know its own address: the one we used
                address = call.node.rpartition(":")[0] + address
            if kind == "MOVED":  # not run: send it where the slot lives now
                self._slots[int(slot)], call.asking = address, None
                self._refresh_soon()
                self._moved[int(slot)] = address
            else:  # the slot is migrating and the key is already on the importing master
                call.asking = address
            self._route(call)
        elif text.startswith(("TRYAGAIN", "CLUSTERDOWN")):
            call.asking = None
            asyncio.get_running_loop().call_later(_RETRY_PAUSE_S, self._route, call)
        else:
            if isinstance(cause, redis_errors.ConnectionError | redis_errors.TimeoutError):
                self._refresh_soon()  # a failover moves the slots: learn where they went
            call.job.fail(error)

    def _node(self, name: str) -> CommandBatcher:
        """The batcher of master ``name`` (``host:port``): the cluster client's connection
        settings (TLS, AUTH…) at that address, on a connection of its own."""
        batcher = self._nodes.get(name)
        if batcher is None:
            host, _, port = name.rpartition(":")
            settings: dict[str, Any] = dict(self._client.get_connection_kwargs())
            kind = settings.pop("connection_class", None) or Connection
            pool = ConnectionPool(connection_class=kind, **{**settings, "host": host,
                                                             "port": int(port)})
            batcher = CommandBatcher(Redis(connection_pool=pool), f"{name} (cluster)",
                                     timeout=self._timeout)
            batcher.start()
            self._nodes[name] = batcher
        return batcher

    # ---- the slot map -------------------------------------------------------------------------

    def _refresh_soon(self) -> None:
        if self._refreshing is None and self._started:
            self._moved = {}
            self._refreshing = asyncio.create_task(self._refresh(), name="debatebus-cluster-slots")

    async def _refresh(self) -> None:
        try:
            slots = await self._read_slots()
            for slot, address in self._moved.items():
                slots[slot] = address
            self._slots = slots
        except Exception as e:
            parked, self._parked = self._parked, []
            mapped = e if isinstance(e, DebatebusError) else transport_error(e, self._where)
            for call in parked:
                call.job.fail(mapped)
            return
        finally:
            self._refreshing = None
        parked, self._parked = self._parked, []
        for call in parked:
            self._route(call)

    async def _read_slots(self) -> list[str | None]:
        """``CLUSTER SLOTS`` from the first master that answers: the ones known, else the
        client's nodes."""
        known = list(dict.fromkeys(name for name in self._slots if name is not None))
        if not known:
            await self._client.initialize()
            known = [node.name for node in self._client.get_nodes()]
        error: BaseException = TransportError(f"no node of the Redis Cluster at {self._where}")
        for name in known:
            try:
                (reply,) = await self._node(name).submit((("CLUSTER", "SLOTS"),))
            except TransportError as e:
                error = e
                continue
            return _slot_map(reply, name)
        raise error


def _slot_map(reply: list[Any], asked: str) -> list[str | None]:
    """``CLUSTER SLOTS``' reply → the owner of each slot (``host:port``)."""
    slots: list[str | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
    for start, end, primary, *_ in reply:
        host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
        name = f"{host or asked.rpartition(':')[0]}:{int(primary[1])}"
        for slot in range(int(start), int(end) + 1):
            slots[slot] = name
    return slots
