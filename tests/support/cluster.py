"""A real 3-master Redis Cluster for tests: three ``redis-server --cluster-enabled yes`` on free
loopback ports, each in its own temp dir, joined by ``redis-cli --cluster create``."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.cluster import RedisCluster

from tests.support.servers import free_port, wait_for_port

__all__ = ["RedisClusterServers"]


@dataclass
class RedisClusterServers:
    """Three masters, no replicas. ``url`` is a debatebus cluster URL seeded at the first node."""

    ports: list[int]
    dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def start(cls, masters: int = 3) -> RedisClusterServers:
        binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if binary is None or cli is None:
            raise RuntimeError("redis-server/redis-cli not found: install Debian's redis-server")
        servers = cls([free_port() for _ in range(masters)],
                      Path(tempfile.mkdtemp(prefix="debatebus-cluster-")))
        try:
            for port in servers.ports:
                node_dir = servers.dir / str(port)
                node_dir.mkdir()
                servers.procs.append(subprocess.Popen(
                    [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir),
                     "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-port", str(free_port()),  # not port + 10000: that may be > 65535
                     "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
                     "--protected-mode", "no"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for port, proc in zip(servers.ports, servers.procs, strict=True):
                wait_for_port(port, proc=proc)
            subprocess.run([cli, "--cluster", "create",
                            *(f"127.0.0.1:{port}" for port in servers.ports),
                            "--cluster-replicas", "0", "--cluster-yes"],
                           check=True, capture_output=True, timeout=60)
            servers.wait_ok()
        except BaseException:
            servers.stop()
            raise
        return servers

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every node says ``cluster_state:ok`` and agrees all slots are covered."""
        deadline = time.monotonic() + timeout
        while True:
            states = []
            for port in self.ports:
                with contextlib.suppress(redis.RedisError):
                    info = self.node(port).execute_command("CLUSTER", "INFO")
                    states.append(b"cluster_state:ok" in info and b"cluster_slots_ok:16384" in info)
            if len(states) == len(self.ports) and all(states):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster on {self.ports} did not reach cluster_state:ok")
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0?cluster=true"

    def client(self) -> RedisCluster:
        """A plain synchronous cluster client, for inspecting keys wherever they live."""
        return RedisCluster(host="127.0.0.1", port=self.ports[0], socket_timeout=10)

    def node_id(self, port: int) -> str:
        return str(self.node(port).execute_command("CLUSTER", "MYID").decode())

    def owner(self, key: str) -> int:
        """The port of the master holding ``key``'s slot."""
        slot = int(self.node(self.ports[0]).execute_command("CLUSTER", "KEYSLOT", key))
        for start, end, primary, *_ in self.node(self.ports[0]).execute_command("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                return int(primary[1])
        raise LookupError(f"no master holds slot {slot}")

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
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
