"""The one slot → master map of a Redis Cluster that debatebus keeps (``ClusterMap``): every
command a batcher sends, pipelined or through ``on_master``, goes where it says.

It is read with ``CLUSTER SLOTS``, sent on debatebus's own connections (a batcher per node: no
redis-py internals), from the first node that answers: those the last map named (masters first),
then the seeds (the hosts of the URL), then the nodes the client knows, then the known ones that
could not be reached. So when every node the map knows fails, it goes back to the seeds.

It is read again on every ``MOVED`` (the owner the redirect told is kept at once, and wins over a
read that was scheduled before it, which may predate it) and after every refusal or failure to
reach a node: at once after a calm spell, then spaced out by ``Backoff`` up to ``_PAUSE_CAP_S``.
Each read names the masters; a node it no longer names as one is forgotten (``on_read`` tells the
batcher, which closes its connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS

from debatebus._backoff import Backoff
from debatebus._redis.batcher import NotSentError
from debatebus._redis.errors import transport_error
from debatebus.exceptions import DebatebusError, TransportError

#: Map reads less than _CALM_S after the last one wait first: 50 ms, then twice as long each
#: time (with full jitter), at most _PAUSE_CAP_S.
_PAUSE_BASE_S, _PAUSE_CAP_S, _CALM_S = 0.05, 0.5, 1.0

#: Sends ``CLUSTER SLOTS`` to a node (``host:port``) and returns its reply; ``NotSentError``
#: when no connection to it could be opened.
Ask = Callable[[str], Awaitable[Any]]
#: Told after every read: the masters to keep (``None`` and the error when no node answered).
OnRead = Callable[["set[str] | None", "DebatebusError | None"], None]


@dataclass(slots=True)
class SlotMap:
    """One ``CLUSTER SLOTS`` reply: each slot's master, the masters, and every node it names
    (masters first, then replicas)."""

    owners: list[str | None]
    masters: set[str]
    nodes: list[str]


class ClusterMap:
    """The slot map, shared by everything that routes on one cluster (see the module docstring).
    ``client``: the cluster client, for the nodes it knows when the map and seeds fail."""

    def __init__(self, client: RedisCluster, where: str, *, timeout: float, seeds: Sequence[str],
                 ask: Ask, on_read: OnRead) -> None:
        self._client = client
        self._where = where
        self._timeout = timeout
        self._seeds = list(seeds)
        self._ask = ask
        self._on_read = on_read
        self._owners: list[str | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        #: The nodes the last map named, masters first: the ones asked for the next map.
        self._known: list[str] = []
        #: Nodes no connection could be opened to since they last answered: asked last.
        self._unreachable: set[str] = set()
        #: Owners told by MOVED replies since the running read was scheduled: they win over its
        #: reply, which may predate them (or come from a node that has not heard yet).
        self._moved: dict[int, str] = {}
        self._reading: asyncio.Task[None] | None = None
        self._pauses = Backoff(_PAUSE_BASE_S, _PAUSE_CAP_S)
        self._last_read = -math.inf
        self._running = False
        #: Why the last read found no node that answers (None once one did).
        self._failed: DebatebusError | None = None

    def start(self) -> None:
        self._running = True

    async def stop(self) -> None:
        self._running = False
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reading

    async def ready(self) -> None:
        """Return once a map has been read (reading one now if none was yet); the error of that
        read when no node answered."""
        while not self._known:
            self.read_soon()
            if self._reading is None:  # stopped
                raise TransportError(f"the Redis Cluster at {self._where} is closed")
            await asyncio.shield(self._reading)
            if not self._known and self._failed is not None:
                raise self._failed

    def owner(self, slot: int) -> str | None:
        """The master of ``slot`` (``host:port``), or None until a map names one."""
        return self._owners[slot]

    def moved(self, slot: int, address: str) -> None:
        """A ``MOVED`` reply: ``slot`` lives at ``address`` now; the map is read again."""
        self.read_soon()
        self._owners[slot] = self._moved[slot] = address

    def unreachable(self, node: str) -> None:
        """No connection to ``node`` could be opened: it is asked for a map last."""
        self._unreachable.add(node)

    def reached(self, node: str) -> None:
        if self._unreachable:
            self._unreachable.discard(node)

    def read_soon(self) -> None:
        """Read the map again, unless a read is on its way already."""
        if self._reading is None and self._running:
            self._moved = {}
            self._reading = asyncio.create_task(self._refresh(), name="debatebus-cluster-slots")

    async def _refresh(self) -> None:
        loop = asyncio.get_running_loop()
        found: SlotMap | None = None
        error: DebatebusError | None = None
        try:
            # Reads that follow each other closely (a dead master's commands failing again and
            # again until a replica takes its slots) are spaced out, up to _PAUSE_CAP_S apart.
            if loop.time() - self._last_read < _CALM_S:
                await asyncio.sleep(self._pauses.next())
            else:
                self._pauses.reset()
            async with asyncio.timeout(self._timeout):
                found = await self.read()
        except Exception as e:
            error = e if isinstance(e, DebatebusError) else transport_error(e, self._where)
        finally:
            self._reading = None
            self._last_read = loop.time()
        self._failed = error
        if found is None:
            self._on_read(None, error)
            return
        for slot, address in self._moved.items():
            found.owners[slot] = address
        self._owners, self._known = found.owners, found.nodes
        self._unreachable &= set(found.nodes)
        self._on_read(found.masters | set(self._moved.values()), None)

    async def read(self) -> SlotMap:
        """``CLUSTER SLOTS`` from the first node that answers (see the module docstring)."""
        if not self._known and not self._seeds:
            await self._client.initialize()  # a caller's client: what it found is all we have
        reachable = [name for name in self._known if name not in self._unreachable]
        asked = dict.fromkeys([*reachable, *self._seeds,
                               *(node.name for node in self._client.get_nodes()),
                               *self._known])
        error: BaseException = TransportError(f"no node of the Redis Cluster at {self._where}")
        for name in asked:
            try:
                reply = await self._ask(name)
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


def _slot_map(reply: list[Any], asked: str) -> SlotMap:
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
    return SlotMap(slots, set(masters), [*masters, *(r for r in replicas if r not in masters)])
