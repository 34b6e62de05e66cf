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
commands on different masters run concurrently, and a command sent again goes after the job's
others (so a job whose commands must stay in order sends a script, as on one node).

**Redirects.** ``MOVED`` (the command did not run) updates the slot and sends the command again
(the owners ``MOVED`` replies told since a map read was scheduled win over its reply, which may
predate them); ``ASK`` sends ``ASKING`` and the command to the importing master. Past
``_MAX_REDIRECTS`` of those the caller gets the error.

**Failures.** Every redirect, refusal or failure to reach a node has the map read again (at once
after a calm spell, then spaced out by a backoff up to ``_PAUSE_CAP_S``), from the first node that
answers: those the last map named, then the seeds (``seeds``: the hosts of the URL), then the
nodes the client knows, then the known ones that could not be reached. A node the new map no
longer names as a master is forgotten (its connection closed). A command that did not run —
never sent, because no connection to its master could be opened (``NotSentError``: the master
is dead and, until a replica takes its slots, the map still names it), or refused whole by the
cluster (``TRYAGAIN`` during a migration, ``CLUSTERDOWN`` while a slot has no live master) — waits
for the next map and is sent where it says, whatever the command, for up to ``timeout`` seconds
from its enqueue; then the caller gets the error. A command that was written and got no reply
(a lost connection, a timeout) may have run: the caller gets the error and decides whether to
send it again (see ``ClusterBatcher._landed``). So a failover costs the commands in flight on
the dead master (their callers retry what is safe to retry) and a pause, not the requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from redis import exceptions as redis_errors
from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.connection import Connection
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from debatebus.backoff import Backoff
from debatebus.exceptions import ConfigError, DebatebusError, TransportError
from debatebus.transports.redis_common import Command, RedisClient, is_cluster, transport_error
from debatebus.transports.redis_pipeline import Check, CommandBatcher, NotSentError

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
#: Map reads less than _CALM_S after the last one wait first: 50 ms, then twice as long each
#: time (with full jitter), at most _PAUSE_CAP_S.
_PAUSE_BASE_S, _PAUSE_CAP_S, _CALM_S = 0.05, 0.5, 1.0
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


def make_batcher(client: RedisClient, where: str, *, timeout: float,
                 seeds: Sequence[str] = ()) -> Batcher:
    """The batcher for ``client``: one connection, or one per master of a cluster. ``seeds``: the
    ``host:port`` of the nodes a cluster URL names (``seed_names``), asked for the slot map when
    no node the batcher knows answers."""
    if is_cluster(client):
        return ClusterBatcher(client, where, timeout=timeout, seeds=seeds)
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
    deadline: float  # loop time: past it, a command not sent yet is not tried again
    redirects: int = 0  # MOVED and ASK replies followed
    asking: str | None = None  # the master an ASK sent us to
    node: str = ""  # where it was sent last


@dataclass(slots=True)
class _SlotMap:
    """One ``CLUSTER SLOTS`` reply: each slot's master, the masters, and every node it names
    (masters first, then replicas)."""

    owners: list[str | None]
    masters: set[str]
    nodes: list[str]


class ClusterBatcher:
    """Routes every command to the master of its slot, through one ``CommandBatcher`` per master
    (see the module docstring). Same interface and failure rules as ``CommandBatcher``, plus:
    what was not sent, or was refused whole by the cluster, is sent again where the next slot map
    says, for up to ``timeout`` seconds (see *Failures* in the module docstring)."""

    def __init__(self, client: RedisCluster, where: str, *, timeout: float,
                 seeds: Sequence[str] = ()) -> None:
        self._client = client
        self._where = where
        self._timeout = timeout
        self._seeds = list(seeds)
        self._slots: list[str | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        #: The nodes the last map named, masters first: the ones asked for the next map.
        self._known: list[str] = []
        #: Nodes no connection could be opened to since they last answered: asked for a map last.
        self._unreachable: set[str] = set()
        self._nodes: dict[str, CommandBatcher] = {}
        self._closing: set[asyncio.Task[None]] = set()  # batchers of forgotten nodes
        self._parked: list[_Call] = []  # waiting for the next slot map
        self._refreshing: asyncio.Task[None] | None = None
        #: Owners told by MOVED replies since the running refresh was scheduled: they win over
        #: its reply, which may predate them (or come from a node that has not heard yet).
        self._moved: dict[int, str] = {}
        self._pauses = Backoff(_PAUSE_BASE_S, _PAUSE_CAP_S)
        self._last_refresh = -math.inf
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
            call.job.fail(self._closed_error())
        nodes, self._nodes = list(self._nodes.values()), {}
        await asyncio.gather(*(node.stop() for node in nodes), *list(self._closing))

    async def submit(self, commands: Sequence[Command]) -> list[Any]:
        return await self.enqueue(commands)

    def enqueue(self, commands: Sequence[Command], *,
                check: Check | None = None) -> asyncio.Future[list[Any]]:
        if not self._started:
            raise TransportError("the Redis transport is not connected: call connect() or use async with")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        job = _Job(future, [None] * len(commands), len(commands), check)
        if not commands:
            future.set_result([])
        deadline = loop.time() + self._timeout
        for index, command in enumerate(commands):
            self._route(_Call(job, index, command, deadline))
        return future

    # ---- routing ------------------------------------------------------------------------------

    def _closed_error(self) -> NotSentError:
        return NotSentError(f"the connection to Redis at {self._where} was closed before this "
                            "command was sent")

    def _route(self, call: _Call) -> None:
        if call.job.future.done():
            return
        try:
            node = call.asking or self._slots[command_slot(call.command)]
        except (TypeError, ValueError, IndexError) as e:  # no key to route by
            call.job.fail(TransportError(f"cannot route {call.command[0]!r} on a Redis Cluster: "
                                         f"{e}"))
            return
        if not self._started:  # stopped while the command waited
            call.job.fail(self._closed_error())
            return
        if node is None:
            self._park(call, None)
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
        # The outcome is read first, whatever becomes of the job: an error nobody reads is logged
        # as "Future exception was never retrieved" (a job's second command failing after its
        # first one failed the job, say).
        error = TransportError("cancelled") if sent.cancelled() else sent.exception()
        if error is None:
            if self._unreachable:
                self._unreachable.discard(call.node)
            call.job.put(call.index, sent.result()[-1])
            return
        if call.job.future.done():
            return
        cause = error.__cause__
        reply = str(cause) if isinstance(cause, redis_errors.ResponseError) else ""
        if reply.startswith(("MOVED ", "ASK ")):
            self._redirect(call, reply, error)
        elif isinstance(error, NotSentError) or reply.startswith(("TRYAGAIN", "CLUSTERDOWN")):
            # Not run: it never left (no connection to its master could be opened: the master
            # died, and until a replica takes its slots the map still names it), or the cluster
            # refused it whole (TRYAGAIN: its keys are split by a migration; CLUSTERDOWN: a slot
            # has no live master, as during a failover). Whatever the command, sending it again
            # cannot run it twice: it goes where the next map says, until its deadline.
            if isinstance(error, NotSentError):
                self._unreachable.add(call.node)
            self._park(call, error)
        else:
            if not reply:  # the connection was lost or went silent: the slots may have moved
                self._refresh_soon()
            # Any other failure is the caller's: a reply error, or a command that was written
            # and got no reply. That one may have run, so it is never sent again here: not every
            # command can be repeated (a publish's XADD would add its entry twice, a checkpoint's
            # RPUSHX its entries twice, the rate limiter's acquire would take budget twice). The
            # callers repeat what is safe to repeat: the settler retries a settle until it lands,
            # because the settle script first checks that the entry is still pending (XPENDING)
            # and publishes nothing when it was settled already (redis_entries.SETTLE); the
            # durable runner retries the checkpoint store's writes (a repeated round entry is
            # skipped on restore, finish overwrites, start re-takes its own lease).
            call.job.fail(error)

    def _redirect(self, call: _Call, reply: str, error: BaseException) -> None:
        """``MOVED`` (not run: send it where the slot lives now) or ``ASK`` (the slot is migrating
        and the key is already on the importing master)."""
        if call.redirects >= _MAX_REDIRECTS:
            call.job.fail(error)
            return
        call.redirects += 1
        kind, slot, address = reply.split()[:3]
        if address.startswith(":"):  # the node did not know its own address: the one we used
            address = call.node.rpartition(":")[0] + address
        self._refresh_soon()
        if kind == "MOVED":
            self._slots[int(slot)], call.asking = address, None
            self._moved[int(slot)] = address
        else:
            call.asking = address
        self._route(call)

    def _park(self, call: _Call, error: BaseException | None) -> None:
        """Hold ``call``, which did not run, until the next slot map routes it again; past its
        deadline it fails with ``error`` instead."""
        if not self._started:
            call.job.fail(self._closed_error())
            return
        if asyncio.get_running_loop().time() >= call.deadline:
            call.job.fail(error or TransportError(
                f"no master of the Redis Cluster at {self._where} holds slot "
                f"{command_slot(call.command)}: is every slot assigned (CLUSTER SLOTS)?"))
            return
        call.asking = None
        self._parked.append(call)
        self._refresh_soon()

    def _node(self, name: str) -> CommandBatcher:
        """The batcher of node ``name`` (``host:port``): the cluster client's connection
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

    def _forget(self, name: str) -> None:
        """Close node ``name``'s batcher in the background: what it holds unsent fails with
        ``NotSentError`` and is routed again; what it sent gets its replies first."""
        task = asyncio.create_task(self._nodes.pop(name).stop(),
                                   name=f"debatebus-cluster-close-{name}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # ---- the slot map -------------------------------------------------------------------------

    def _refresh_soon(self) -> None:
        if self._refreshing is None and self._started:
            self._moved = {}
            self._refreshing = asyncio.create_task(self._refresh(), name="debatebus-cluster-slots")

    async def _refresh(self) -> None:
        loop = asyncio.get_running_loop()
        found: _SlotMap | None = None
        error: DebatebusError | None = None
        try:
            # Reads that follow each other closely (a dead master's commands failing again and
            # again until a replica takes its slots) are spaced out, up to _PAUSE_CAP_S apart.
            if loop.time() - self._last_refresh < _CALM_S:
                await asyncio.sleep(self._pauses.next())
            else:
                self._pauses.reset()
            async with asyncio.timeout(self._timeout):
                found = await self._read_slots()
        except Exception as e:
            error = e if isinstance(e, DebatebusError) else transport_error(e, self._where)
        finally:
            self._refreshing = None
            self._last_refresh = loop.time()
        parked, self._parked = self._parked, []
        if found is None:  # no node answered: what is parked waits for the next read
            for call in parked:
                self._park(call, error)
            return
        for slot, address in self._moved.items():
            found.owners[slot] = address
        self._slots, self._known = found.owners, found.nodes
        self._unreachable &= set(found.nodes)
        keep = found.masters | set(self._moved.values())
        for name in [name for name in self._nodes if name not in keep]:
            self._forget(name)  # gone, or no master any more (a replica, a seed asked for the map)
        for call in parked:
            self._route(call)

    async def _read_slots(self) -> _SlotMap:
        """``CLUSTER SLOTS`` from the first node that answers: the nodes the last map named, then
        the seeds, then the nodes the client knows, then the known ones that could not be
        reached."""
        if not self._known and not self._seeds:
            await self._client.initialize()  # a caller's client: what it found is all we have
        reachable = [name for name in self._known if name not in self._unreachable]
        asked = dict.fromkeys([*reachable, *self._seeds,
                               *(node.name for node in self._client.get_nodes()),
                               *self._known])
        error: BaseException = TransportError(f"no node of the Redis Cluster at {self._where}")
        for name in asked:
            try:
                (reply,) = await self._node(name).submit((("CLUSTER", "SLOTS"),))
            except TransportError as e:
                if isinstance(e, NotSentError):
                    self._unreachable.add(name)
                error = e
                continue
            self._unreachable.discard(name)
            if reply:
                return _slot_map(reply, name)
            error = TransportError(f"the Redis Cluster node {name} holds no slot: is the cluster "
                                   "made (CLUSTER SLOTS)?")
        raise error


def _node_name(node: Sequence[Any], asked: str) -> str:
    """``host:port`` of a node in a ``CLUSTER SLOTS`` reply (no host: the one asked)."""
    host = node[0].decode() if isinstance(node[0], bytes) else str(node[0])
    return f"{host or asked.rpartition(':')[0]}:{int(node[1])}"


def _slot_map(reply: list[Any], asked: str) -> _SlotMap:
    """``CLUSTER SLOTS``' reply → the owner of each slot (``host:port``) and the nodes named."""
    slots: list[str | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
    masters: dict[str, None] = {}
    replicas: dict[str, None] = {}
    for start, end, primary, *others in reply:
        name = _node_name(primary, asked)
        masters[name] = None
        replicas.update(dict.fromkeys(_node_name(node, asked) for node in others))
        for slot in range(int(start), int(end) + 1):
            slots[slot] = name
    return _SlotMap(slots, set(masters), [*masters, *(r for r in replicas if r not in masters)])
