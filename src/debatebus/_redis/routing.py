"""Redis Cluster (``?cluster=true`` on any Redis URL): the batcher that sends each command to the
master owning its slot, and ``make_batcher``, the batcher for any client.

**Routing.** ``ClusterBatcher`` routes by the cluster's one slot map (``ClusterMap``, ``_topology``)
and keeps one ``CommandBatcher`` per master, so commands still go out one pipeline per
master per loop tick. Each command of a job is routed on its own (by its first key: ``KEYS[1]``
of a script, the channel of ``PUBLISH``); the commands a job sends to one master keep their order,
commands on different masters run concurrently, and a command sent again goes after the job's
others (so a job whose commands must stay in order sends a script, as on one node).

**Redirects.** ``MOVED`` (the command did not run) updates the slot and sends the command again
(the owners ``MOVED`` replies told since a map read was scheduled win over its reply, which may
predate them); ``ASK`` sends ``ASKING`` and the command to the importing master. Past
``_MAX_REDIRECTS`` of those the caller gets the error.

**Failures.** Every redirect, refusal or failure to reach a node has the map read again (see
``_topology``); a node the new map no longer names as a master is forgotten (its connection
closed). A command that did not run — never sent, because no connection to its master could be
opened (``NotSentError``: the master is dead and, until a replica takes its slots, the map still
names it), or refused whole by the
cluster (``TRYAGAIN`` during a migration, ``CLUSTERDOWN`` while a slot has no live master) — waits
for the next map and is sent where it says, whatever the command, for up to ``timeout`` seconds
from its enqueue; then the caller gets the error. A command that was written and got no reply
(a lost connection, a timeout) may have run: the caller gets the error and decides whether to
send it again (see ``ClusterBatcher._landed``). So a failover costs the commands in flight on
the dead master (their callers retry what is safe to retry) and a pause, not the requests.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from redis import exceptions as redis_errors
from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.connection import Connection
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from debatebus._backoff import Backoff
from debatebus._redis.batcher import Check, CommandBatcher, NotSentError
from debatebus._redis.clients import RedisClient, is_cluster
from debatebus._redis.connection import Command
from debatebus._redis.errors import no_such_db, redis_call
from debatebus._redis.keys import command_slot
from debatebus._redis.topology import ClusterMap
from debatebus.exceptions import ConfigError, DebatebusError, TransportError

T = TypeVar("T")
_MAX_REDIRECTS = 16


class Batcher(Protocol):
    """What the Redis transports and the checkpoint store need of a batcher: a
    ``CommandBatcher`` on one server, a ``ClusterBatcher`` on a cluster."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def submit(self, commands: Sequence[Command]) -> list[Any]: ...

    def enqueue(self, commands: Sequence[Command], *,
                check: Check | None = None) -> asyncio.Future[list[Any]]: ...

    async def load_script(self, text: str) -> None: ...

    async def on_master(self, key: str, call: Callable[[Redis], Awaitable[T]]) -> T: ...


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


class ClusterBatcher:
    """Routes every command to the master of its slot, through one ``CommandBatcher`` per master
    (see the module docstring). Same interface and failure rules as ``CommandBatcher``, plus:
    what was not sent, or was refused whole by the cluster, is sent again where the next slot map
    says, for up to ``timeout`` seconds (see *Failures* in the module docstring)."""

    #: The slot map's kind (a test may read it its own way).
    Map: type[ClusterMap] = ClusterMap

    def __init__(self, client: RedisCluster, where: str, *, timeout: float,
                 seeds: Sequence[str] = ()) -> None:
        self._client = client
        self._where = where
        self._timeout = timeout
        self._map = self.Map(client, where, timeout=timeout, seeds=seeds, ask=self._ask_slots,
                             on_read=self._map_read)
        self._nodes: dict[str, CommandBatcher] = {}
        self._closing: set[asyncio.Task[None]] = set()  # batchers of forgotten nodes
        self._parked: list[_Call] = []  # waiting for the next slot map
        self._started = False

    def start(self) -> None:
        self._started = True
        self._map.start()

    async def stop(self) -> None:
        self._started = False
        await self._map.stop()
        parked, self._parked = self._parked, []
        for call in parked:
            call.job.fail(self._closed_error())
        nodes, self._nodes = list(self._nodes.values()), {}
        await asyncio.gather(*(node.stop() for node in nodes), *list(self._closing))

    async def submit(self, commands: Sequence[Command]) -> list[Any]:
        return await self.enqueue(commands)

    async def on_master(self, key: str, call: Callable[[Redis], Awaitable[T]]) -> T:
        """``call`` on a redis-py client of the master that owns ``key``'s slot, as the map says:
        what a pipeline of the batcher cannot carry (blocking reads, pub/sub, MULTI/EXEC), routed
        by the same map. What did not run is tried again: after ``MOVED``, where it says (up to
        ``_MAX_REDIRECTS`` times); after ``ASK``, ``TRYAGAIN`` or ``CLUSTERDOWN`` (a slot
        migrating, or without a live master), after a pause, for up to ``timeout`` seconds. A
        failure to reach the master, or an ``UNBLOCKED`` read (its slot moved), has the map read
        again, and is raised: the call may have run."""
        await self._map.ready()
        slot = key_slot(key.encode())
        loop = asyncio.get_running_loop()
        deadline, pauses, redirects = loop.time() + self._timeout, Backoff(0.05, 0.5), 0
        while True:
            node = self._map.owner(slot)
            if node is None:
                raise TransportError(f"no master of the Redis Cluster at {self._where} holds "
                                     f"slot {slot}: is every slot assigned (CLUSTER SLOTS)?")
            try:
                return await self._node(node).on_master(key, call)
            except redis_errors.MovedError as e:
                if redirects >= _MAX_REDIRECTS:
                    raise
                redirects += 1
                self._map.moved(e.slot_id, f"{e.host or node.rpartition(':')[0]}:{e.port}")
            except (redis_errors.AskError, redis_errors.TryAgainError,
                    redis_errors.ClusterDownError):
                if loop.time() >= deadline:
                    raise
                self._map.read_soon()
                await asyncio.sleep(pauses.next())
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError):
                self._map.read_soon()
                raise
            except redis_errors.ResponseError as e:
                if str(e).startswith("UNBLOCKED"):
                    self._map.read_soon()
                raise

    async def load_script(self, text: str) -> None:
        """``SCRIPT LOAD`` on every master the map names (callers while a load is in flight on
        a master share it)."""
        masters = {owner for owner in map(self._map.owner, range(REDIS_CLUSTER_HASH_SLOTS))
                   if owner is not None}
        await asyncio.gather(*(self._node(master).load_script(text) for master in masters))

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
            node = call.asking or self._map.owner(command_slot(call.command))
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
            self._map.reached(call.node)
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
                self._map.unreachable(call.node)
            self._park(call, error)
        else:
            if not reply:  # the connection was lost or went silent: the slots may have moved
                self._map.read_soon()
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
        if kind == "MOVED":
            self._map.moved(int(slot), address)
            call.asking = None
        else:
            self._map.read_soon()
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
        self._map.read_soon()

    def _node(self, name: str) -> CommandBatcher:
        """The batcher of node ``name`` (``host:port``): the cluster client's connection
        settings (TLS, AUTH…) at that address, on a connection of its own; its client carries
        the calls ``on_master`` routes there."""
        batcher = self._nodes.get(name)
        if batcher is None:
            host, _, port = name.rpartition(":")
            settings: dict[str, Any] = dict(self._client.get_connection_kwargs())
            kind = settings.pop("connection_class", None) or Connection
            # The cluster client's reply callbacks: a node client has redis-py's own.
            settings.pop("response_callbacks", None)
            pool = ConnectionPool(connection_class=kind, **{**settings, "host": host,
                                                             "port": int(port)})
            batcher = CommandBatcher(Redis(connection_pool=pool), f"{name} (cluster)",
                                     timeout=self._timeout, owns_client=True)
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

    async def _ask_slots(self, node: str) -> Any:
        (reply,) = await self._node(node).submit((("CLUSTER", "SLOTS"),))
        return reply

    def _map_read(self, masters: set[str] | None, error: DebatebusError | None) -> None:
        """After each map read: forget the nodes that are no master any more (gone, a replica,
        a seed asked for the map), and route what waited for it; when no node answered, what
        waited waits for the next read."""
        parked, self._parked = self._parked, []
        if masters is None:
            for call in parked:
                self._park(call, error)
            return
        for name in [name for name in self._nodes if name not in masters]:
            self._forget(name)
        for call in parked:
            self._route(call)


async def open_batcher(client: RedisClient, where: str, *, timeout: float,
                       seeds: Sequence[str] = ()) -> Batcher:
    """``make_batcher``'s batcher, started and through ``connect_check``; stopped again when the
    check fails."""
    batcher = make_batcher(client, where, timeout=timeout, seeds=seeds)
    batcher.start()
    try:
        await connect_check(batcher, where, timeout)
    except BaseException:
        await batcher.stop()
        raise
    return batcher


async def connect_check(batcher: Batcher, where: str, timeout: float) -> None:
    """The check a Redis component makes when it connects, through its batcher (``start``-ed): a
    PING (on a cluster, once the slot map is read: to a master), bounded by ``timeout``, its
    errors mapped. A database the server does not have (``redis://host/99``) is a
    ``ConfigError`` that says how many it has: one more connection, on database 0, asks it."""
    pools: list[ConnectionPool] = []

    async def ping(redis: Redis) -> None:
        pools.append(redis.connection_pool)
        await redis.ping()

    try:
        async with redis_call(where, timeout):
            await batcher.on_master("", ping)
    except ConfigError as e:
        cause = e.__cause__
        if not pools or cause is None or not no_such_db(cause):
            raise
        pool = pools[-1]  # a cluster has database 0 only: never here
        db = pool.connection_kwargs.get("db")
        raise ConfigError(f"Redis at {where}: database {db} does not exist on this server"
                          f" ({await _databases(pool, timeout)}): fix the /N after host:port in"
                          " the URL") from cause


async def _databases(pool: ConnectionPool, timeout: float) -> str:
    """How many databases the server of ``pool`` has, in words (``CONFIG GET`` may be refused)."""
    first = Redis(connection_pool=ConnectionPool(
        connection_class=pool.connection_class, **{**pool.connection_kwargs, "db": 0}))
    try:
        async with asyncio.timeout(timeout):
            reply = await first.config_get("databases")  # redis-py decodes it: {"databases": "16"}
    except (redis_errors.RedisError, OSError, TimeoutError):
        reply = {}
    finally:
        await first.aclose(close_connection_pool=True)
    count = reply.get("databases") or ""
    if not count.isdigit():
        return "CONFIG GET databases was refused, so how many it has is unknown; 16 by default"
    return f"it has {count}: databases 0..{int(count) - 1}"
