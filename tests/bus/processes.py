"""Starting and stopping worker processes for tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "debatebus", "worker", "tests.bus.worker_app:app"],
            cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            stdout=log.open("ab"), stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def read_calls(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def calls_by_topic(path: Path) -> Counter[str]:
    return Counter(c["topic"] for c in read_calls(path))


def wait_until(predicate: Any, timeout: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
