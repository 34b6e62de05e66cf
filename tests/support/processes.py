"""Starting and stopping worker processes for tests, their environment, and a collector of the
results they publish."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from debatebus.client import BusClient
from debatebus.schemas.envelope import Envelope
from tests.support.bus import transport_options

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """``debatebus worker tests.bus.worker_app:app`` with ``env`` and the extra CLI ``args``."""

    def __init__(self, env: dict[str, str], log: Path, args: Sequence[str] = ()) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "debatebus", "worker", "tests.bus.worker_app:app", *args],
            # src first: this checkout's debatebus, whichever one the venv has installed
            cwd=ROOT, env={**os.environ, **env,
                           "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT)))},
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

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 12) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def problems(self, lines: int = 8) -> str:
        """The worker's last WARNING/ERROR lines and its own state changes (``debatebus._worker``,
        e.g. reconnected): the likely cause of a failed count."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        bad = [line[:400] for line in text.splitlines()
               if " WARNING " in line or " ERROR " in line or " debatebus._worker:" in line]
        return "\n".join(bad[-lines:]) or "(no warnings or errors logged)"

    def assert_alive(self, when: str) -> None:
        """Fail with the exit code and the log's tail if the worker process has exited."""
        code = self.proc.poll()
        if code is not None:
            raise AssertionError(f"worker pid {self.pid} exited with code {code} {when}; its log "
                                 f"ends:\n{self.log_tail()}")


def read_calls(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def calls_by_question(path: Path) -> Counter[str]:
    return Counter(c["question"] for c in read_calls(path))


def committed_round_reruns(path: Path, interruptions: int = 1) -> dict[str, dict[str, Any]]:
    """Debates whose calls show a committed round run again, by question.

    Each (purpose, round, speaker) call of a debate is made once. A debate interrupted mid-round
    (by a broker outage or a killed worker) may repeat the calls of the step it was in, since that
    step was never committed, and of the step before it when that step's write was still on the
    wire (group commit writes a step while the next one's first call is under way): per
    interruption at most two distinct steps, one right after the other, may repeat, each call at
    most ``1 + interruptions`` times. Anything more re-ran a committed round.
    """
    per_debate: dict[str, Counter[tuple[str, int, str]]] = {}
    for call in read_calls(path):
        key = (call["purpose"], call["round"], call["speaker"])
        per_debate.setdefault(call["question"], Counter())[key] += 1
    bad: dict[str, dict[str, Any]] = {}
    for question, counts in per_debate.items():
        repeated = {k: n for k, n in counts.items() if n > 1}
        rounds = sorted({r for (_, r, _) in repeated})
        runs = sum(1 for i, r in enumerate(rounds) if i == 0 or r - rounds[i - 1] > 1)
        if (len(rounds) > 2 * interruptions or runs > interruptions
                or any(n > 1 + interruptions for n in repeated.values())):
            bad[question] = {"repeated calls": repeated, "calls": sum(counts.values())}
    return bad


def assert_store_answers(results: list[Any], ids: list[str]) -> None:
    """Kafka without transactions, a worker SIGKILLed, a checkpoint store: a kill between producing
    a result and committing its offset redelivers the request, which the store answers again
    (debateReplayed, the same output, no model call); a kill after storing the result but before
    producing it leaves the store's answer the only one. So: at most one fresh answer per request,
    every answer completed, and all of a request's answers carry one output."""
    fresh = Counter(e.request_id for e in results if not e.payload.get("debateReplayed"))
    assert all(fresh[i] <= 1 for i in ids), f"fresh results per request: {fresh}"
    outputs: dict[str, str] = {}
    for e in results:
        assert e.payload["debateStatus"] == "completed", e.payload
        first = outputs.setdefault(e.request_id, e.payload["debateOutput"])
        assert e.payload["debateOutput"] == first, e.request_id


def wait_until(predicate: Any, timeout: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def env_for(url: str, event_type: str, tmp_path: Path, **extra: Any) -> dict[str, str]:
    # A fresh group per test: Tansu can strand a group whose leader was the last member to leave.
    env = {"DBB_BROKER": url, "DBB_EVENT_TYPE": event_type, "DBB_GROUP": f"g-{uuid.uuid4().hex[:8]}",
           "DBB_CALLS_LOG": str(tmp_path / "calls.log")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Collector:
    """Every result envelope on an event type's completed/failed topics, by request id."""

    def __init__(self) -> None:
        self.results: list[Envelope] = []
        self.task: asyncio.Task[None] | None = None
        self.arrived = asyncio.Event()

    async def start(self, client: BusClient, event_type: str) -> None:
        it = await client.results(event_type)

        async def pump() -> None:
            async for envelope in it:
                self.results.append(envelope)
                self.arrived.set()

        self.task = asyncio.create_task(pump())

    def counts(self) -> Counter[str]:
        return Counter(e.request_id for e in self.results)

    async def wait_for(self, ids: list[str], timeout: float) -> None:
        await self.wait_for_count(ids, 1, timeout)

    async def wait_for_count(self, ids: list[str], count: int, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while any(self.counts()[i] < count for i in ids):
                await self.arrived.wait()
                self.arrived.clear()


@contextlib.asynccontextmanager
async def collecting(url: str, event_type: str) -> AsyncIterator[tuple[BusClient, Collector]]:
    async with BusClient(url, **transport_options(url)) as client:
        collector = Collector()
        await collector.start(client, event_type)
        try:
            yield client, collector
        finally:
            if collector.task:
                collector.task.cancel()


def start_worker(url: str, et: str, group: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DBB_BROKER": url, "DBB_EVENT_TYPE": et,
           "DEBATEBUS_GROUP": group}
    return subprocess.Popen(
        [sys.executable, "-m", "debatebus", "worker", "tests.observability.cli_app:app",
         "--metrics-port", str(port), "--log-format", "json", "--log-level", "INFO"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
