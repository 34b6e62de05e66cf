"""Starting and stopping worker processes for tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
        """The worker's last WARNING/ERROR lines and its own state changes (``debatebus.worker``,
        e.g. reconnected): the likely cause of a failed count."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        bad = [line[:400] for line in text.splitlines()
               if " WARNING " in line or " ERROR " in line or " debatebus.worker:" in line]
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
