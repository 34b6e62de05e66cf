"""A real Redis Cluster for tests: ``redis-server --cluster-enabled yes`` on free loopback ports,
each in its own temp dir, joined by ``redis-cli --cluster create``. Three masters by default;
with ``replicas=1``, six nodes, one replica per master, so a master can be SIGKILLed (``kill``),
its replica promoted (``wait_failover``) and the killed node started again (``restart``), when it
rejoins as a replica of the node that took its slots."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import redis
from redis.cluster import ClusterNode, RedisCluster

from tests.support import markers
from tests.support.servers import free_port, wait_for_port

__all__ = ["RedisClusterServers"]

T = TypeVar("T")


@dataclass
class RedisClusterServers:
    """The nodes of one cluster. ``url`` is a debatebus cluster URL seeded at the first node,
    ``seeds_url`` one naming every node as a seed (as an operator's would)."""

    ports: list[int]
    dir: Path
    node_timeout_ms: int = 2000
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: Each node's cluster bus port, kept so that a restarted node is the same node.
    bus_ports: dict[int, int] = field(default_factory=dict)

    @classmethod
    def start(cls, masters: int = 3, *, replicas: int = 0,
              node_timeout_ms: int = 2000) -> RedisClusterServers:
        markers.require("redis", "a Redis Cluster")
        cli = shutil.which("redis-cli")
        if shutil.which("redis-server") is None or cli is None:
            raise RuntimeError("redis-server/redis-cli not found: install Debian's redis-server")
        servers = cls([free_port() for _ in range(masters * (1 + replicas))],
                      Path(tempfile.mkdtemp(prefix="debatebus-cluster-")), node_timeout_ms)
        try:
            for port in servers.ports:
                (servers.dir / str(port)).mkdir()
                servers.bus_ports[port] = free_port()  # not port + 10000: that may be > 65535
                servers._spawn(port)
            for port in servers.ports:
                wait_for_port(port, proc=servers.procs[port])
            subprocess.run([cli, "--cluster", "create",
                            *(f"127.0.0.1:{port}" for port in servers.ports),
                            "--cluster-replicas", str(replicas), "--cluster-yes"],
                           check=True, capture_output=True, timeout=60)
            servers.wait_ok()
            if replicas:
                servers._wait(lambda: all(servers.replica_synced(port)
                                          for port in servers.replica_ports()) or None,
                              30.0, "every replica to finish its first sync")
        except BaseException:
            servers.stop()
            raise
        return servers

    def _spawn(self, port: int) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None
        self.procs[port] = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.dir / str(port)),
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-port", str(self.bus_ports[port]),
             "--cluster-node-timeout", str(self.node_timeout_ms), "--save", "",
             "--appendonly", "no", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @staticmethod
    def _wait(probe: Callable[[], T | None], timeout: float, what: str) -> T:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(redis.RedisError):
                found = probe()
                if found is not None:
                    return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up after {timeout:g} s waiting for {what}")
            time.sleep(0.05)

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)

    def live_ports(self) -> list[int]:
        return [port for port in self.ports if self.procs[port].poll() is None]

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says ``cluster_state:ok`` and agrees all slots are covered."""

        def ok() -> bool | None:
            for port in self.live_ports():
                info = self.node(port).execute_command("CLUSTER", "INFO")
                if b"cluster_state:ok" not in info or b"cluster_slots_ok:16384" not in info:
                    return None
            return True

        self._wait(ok, timeout, f"the cluster on {self.live_ports()} to reach cluster_state:ok")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0?cluster=true"

    @property
    def seeds_url(self) -> str:
        return f"redis://{','.join(f'127.0.0.1:{port}' for port in self.ports)}/0?cluster=true"

    def client(self) -> RedisCluster:
        """A plain synchronous cluster client, for inspecting keys wherever they live."""
        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", port)
                                           for port in self.live_ports()], socket_timeout=10)

    def node_id(self, port: int) -> str:
        return str(self.node(port).execute_command("CLUSTER", "MYID").decode())

    def owner(self, key: str, asking: int | None = None) -> int:
        """The port of the master holding ``key``'s slot, as node ``asking`` (by default the
        first live node) sees it."""
        ask = self.node(asking if asking is not None else self.live_ports()[0])
        slot = int(ask.execute_command("CLUSTER", "KEYSLOT", key))
        for start, end, primary, *_ in ask.execute_command("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                return int(primary[1])
        raise LookupError(f"no master holds slot {slot}")

    def replica_ports(self) -> list[int]:
        return [port for port in self.live_ports()
                if self.node(port).info("replication")["role"] == "slave"]

    def replica_synced(self, port: int) -> bool:
        info = self.node(port).info("replication")
        return bool(info["role"] == "slave" and info.get("master_link_status") == "up"
                    and not info.get("master_sync_in_progress"))

    def kill(self, port: int) -> None:
        """SIGKILL node ``port``: no goodbye to its clients or to the cluster."""
        proc = self.procs[port]
        proc.kill()
        proc.wait(10)

    def wait_failover(self, key: str, dead: int, timeout: float = 30.0) -> int:
        """Until every live node says ``key``'s slot has a master other than ``dead`` and the
        cluster is ok again: that master's port."""
        def promoted() -> int | None:
            owners = {self.owner(key, asking=port) for port in self.live_ports()}
            return owners.pop() if len(owners) == 1 and dead not in owners else None

        owner = self._wait(promoted, timeout, f"a replica of {dead} to take {key}'s slot")
        self.wait_ok(timeout)
        return owner

    def restart(self, port: int, timeout: float = 30.0) -> None:
        """Start a killed node again, on its port, dir and cluster bus port (its ``nodes.conf``
        says who it is); without persistence it comes back empty, learns that its slots moved
        and becomes a replica of their new master. Returns once it is one, synced."""
        self._spawn(port)
        wait_for_port(port, proc=self.procs[port])
        self._wait(lambda: self.replica_synced(port) or None, timeout,
                   f"the restarted node {port} to rejoin as a synced replica")
        self.wait_ok(timeout)

    def migrate_slot(self, slot: int, source: int, target: int) -> None:
        """Move ``slot`` from master ``source`` to master ``target``, keys and all, the way
        ``redis-cli --cluster reshard`` does: IMPORTING/MIGRATING, MIGRATE each key, then NODE."""
        src, dst = self.node(source), self.node(target)
        src_id, dst_id = self.node_id(source), self.node_id(target)
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
        for port in [target, *(p for p in self.ports if p != target)]:  # the new owner first
            self.node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
