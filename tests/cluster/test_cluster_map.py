"""``ClusterMap``, the one slot map of a Redis Cluster, over nodes that answer ``CLUSTER SLOTS``
or not (no server needed): which nodes it asks, in what order, the fall-back to the seeds when
every node it knows fails, and the masters it forgets."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import RedisCluster

from debatebus._redis import NotSentError
from debatebus._redis.topology import ClusterMap
from debatebus.exceptions import DebatebusError, TransportError


def _slots(*ranges: tuple[int, int, str, list[str]]) -> list[Any]:
    """A ``CLUSTER SLOTS`` reply: (first slot, last slot, master, replicas)."""
    def node(name: str) -> list[Any]:
        host, _, port = name.rpartition(":")
        return [host.encode(), int(port), b"id"]
    return [[start, end, node(master), *map(node, replicas)] for start, end, master, replicas
            in ranges]


class _Nodes:
    """What each node answers; a dead one cannot be reached (``NotSentError``)."""

    def __init__(self) -> None:
        self.replies: dict[str, list[Any]] = {}
        self.dead: set[str] = set()
        self.asked: list[str] = []

    async def ask(self, node: str) -> Any:
        self.asked.append(node)
        if node in self.dead or node not in self.replies:
            raise NotSentError(f"cannot reach {node}")
        return self.replies[node]


class _Reads:
    """What ``on_read`` was told, read by read."""

    def __init__(self) -> None:
        self.told: asyncio.Queue[tuple[set[str] | None, DebatebusError | None]] = asyncio.Queue()

    def __call__(self, masters: set[str] | None, error: DebatebusError | None) -> None:
        self.told.put_nowait((masters, error))

    async def next(self) -> tuple[set[str] | None, DebatebusError | None]:
        return await asyncio.wait_for(self.told.get(), 10.0)


async def test_the_map_goes_back_to_the_seeds_when_every_node_it_knows_fails() -> None:
    nodes, reads = _Nodes(), _Reads()
    seeds = ["10.0.0.1:7000", "10.0.0.2:7000"]
    first = _slots((0, 8191, "10.0.1.1:7000", ["10.0.1.9:7000"]),
                   (8192, 16383, "10.0.1.2:7000", []))
    nodes.replies["10.0.0.2:7000"] = first
    nodes.dead.add("10.0.0.1:7000")
    client = RedisCluster(host="10.0.0.1", port=7000)  # never connected: it knows no node
    cluster = ClusterMap(client, "test", timeout=5.0, seeds=seeds, ask=nodes.ask, on_read=reads)
    cluster.start()
    try:
        cluster.read_soon()
        assert await reads.next() == ({"10.0.1.1:7000", "10.0.1.2:7000"}, None)
        assert nodes.asked == seeds  # the first seed is dead: the second one answers
        assert (cluster.owner(0), cluster.owner(16383)) == ("10.0.1.1:7000", "10.0.1.2:7000")

        # Every node of that map dies; a seed knows the new master of every slot.
        nodes.dead |= {"10.0.1.1:7000", "10.0.1.2:7000", "10.0.1.9:7000"}
        nodes.replies["10.0.0.2:7000"] = _slots((0, 16383, "10.0.2.1:7000", []))
        nodes.asked.clear()
        cluster.read_soon()
        masters, error = await reads.next()
        assert (masters, error) == ({"10.0.2.1:7000"}, None), "the dead masters are forgotten"
        assert nodes.asked == ["10.0.1.1:7000", "10.0.1.2:7000", "10.0.1.9:7000", *seeds]
        assert cluster.owner(0) == cluster.owner(16383) == "10.0.2.1:7000"

        # Nobody answers at all: the map says so, and keeps what it knew.
        nodes.dead.add("10.0.0.2:7000")
        nodes.dead.add("10.0.2.1:7000")
        cluster.read_soon()
        masters, error = await reads.next()
        assert masters is None and isinstance(error, TransportError)
        assert cluster.owner(0) == "10.0.2.1:7000"
    finally:
        await cluster.stop()
        await client.aclose()


async def test_a_moved_owner_wins_over_the_read_it_started() -> None:
    """A ``MOVED`` reply's owner is kept at once, and over the map read it started (which may
    predate it); the new owner is kept as a master even if that read does not name it yet."""
    nodes, reads = _Nodes(), _Reads()
    nodes.replies["10.0.0.1:7000"] = _slots((0, 16383, "10.0.1.1:7000", []))
    client = RedisCluster(host="10.0.0.1", port=7000)
    cluster = ClusterMap(client, "test", timeout=5.0, seeds=["10.0.0.1:7000"], ask=nodes.ask,
                         on_read=reads)
    cluster.start()
    try:
        cluster.moved(42, "10.0.1.2:7000")
        assert cluster.owner(42) == "10.0.1.2:7000"
        masters, _ = await reads.next()
        assert masters == {"10.0.1.1:7000", "10.0.1.2:7000"}
        assert (cluster.owner(41), cluster.owner(42)) == ("10.0.1.1:7000", "10.0.1.2:7000")
    finally:
        await cluster.stop()
        await client.aclose()
