"""``debatebus publish --wait`` and ``debatebus tail`` against a worker process on Redis Streams."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.support.processes import ROOT, WorkerProcess, env_for


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "debatebus", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


async def test_publish_wait_prints_the_result_and_tail_follows_results(
        redis_server: Any, tmp_path: Path) -> None:
    event_type = f"debate:cli{uuid.uuid4().hex[:6]}"
    worker = WorkerProcess(env_for(redis_server.url, event_type, tmp_path), tmp_path / "w.log")
    tail = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "debatebus", "tail", f"event:{event_type}:completed",
         "--broker", redis_server.url, "--count", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        await asyncio.sleep(1.0)  # tail prints what arrives after it starts
        done = await asyncio.to_thread(cli, "publish", event_type, "--input", "Should we?",
                                       "--broker", redis_server.url, "--wait",
                                       "--request-id", "cli-9")
        tailed, _ = await asyncio.to_thread(tail.communicate, timeout=60)
    finally:
        worker.stop()
        tail.kill()
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["requestId"] == "cli-9"
    assert printed["payload"]["debateStatus"] == "completed"
    assert json.loads(tailed.strip())["requestId"] == "cli-9"


def test_bad_arguments_exit_2_with_a_sentence() -> None:
    out = cli("publish", "debate:request", "--broker", "memory://")
    assert out.returncode == 2
    assert "give --input" in out.stderr
    out = cli("worker", "no_colon_here")
    assert out.returncode == 2
    assert "module:attribute" in out.stderr
