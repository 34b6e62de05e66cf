"""Sub-debates across worker processes on Redis Streams: the child is served by a second worker,
and a parent whose worker is SIGKILLed while its child runs resumes on another worker, waits for
that same child (one child debate) and completes; a replay of it then costs zero calls."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.bus.worker_app import REVISED_AFTER_PANEL
from tests.support.processes import WorkerProcess, collecting, read_calls, wait_until
from tests.support.subdebates import revision_of

pytestmark = pytest.mark.slow

PANEL_SAYS = "the panel: rotate the session keys first"


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.stop()


def envs(url: str, tmp_path: Path) -> tuple[str, str, dict[str, str], dict[str, str]]:
    tag = uuid.uuid4().hex[:8]
    parent_type, security_type = f"debate:launch:{tag}", f"debate:security:{tag}"
    common = {"DBB_BROKER": url, "DBB_STORE": url, "DBB_LEASE_TTL": "2",
              "DBB_CLAIM_IDLE_MS": "1500", "DBB_CALLS_LOG": str(tmp_path / "calls.log"),
              "DBB_PROTOCOL": "cross-pollination", "DBB_JUDGE": "0", "DBB_GROUP": f"g-{tag}"}
    parent = {**common, "DBB_EVENT_TYPE": parent_type, "DBB_DELAY": "0.05",
              "DBB_SUB_DEBATES": f"security={security_type}"}
    child = {**common, "DBB_EVENT_TYPE": security_type, "DBB_DELAY": "1.0",
             "DBB_SYNTHESIS": PANEL_SAYS}
    return parent_type, security_type, parent, child


def calls_of(tmp_path: Path, pid: int) -> Counter[tuple[str, int, str]]:
    return Counter((c["purpose"], c["round"], c["speaker"])
                   for c in read_calls(tmp_path / "calls.log") if c["pid"] == pid)


async def test_a_parent_killed_while_its_child_runs_resumes_and_waits_for_that_child(
        redis_server: Any, workers: list[WorkerProcess], tmp_path: Path) -> None:
    url = redis_server.url
    parent_type, security_type, parent_env, child_env = envs(url, tmp_path)
    async with collecting(url, parent_type) as (client, collector):
        first = WorkerProcess(parent_env, tmp_path / "parent-1.log")
        panel = WorkerProcess(child_env, tmp_path / "panel.log")
        workers += [first, panel]
        await client.publish(parent_type, {"input": "ship it?"}, request_id="p1")
        await asyncio.to_thread(wait_until, lambda: sum(calls_of(tmp_path, panel.pid).values()) >= 1,
                                60, "the child debate to start on the panel's worker")
        first.kill()
        second = WorkerProcess(parent_env, tmp_path / "parent-2.log")
        workers.append(second)
        await collector.wait_for(["p1"], 120)
        calls = len(read_calls(tmp_path / "calls.log"))
        await client.publish(parent_type, {"input": "ship it?"}, request_id="p1")
        await collector.wait_for_count(["p1"], 2, 60)
        child_requests = [d async for d in client.transport.read_range(security_type)]

    result, replay = collector.results
    assert result.payload["debateStatus"] == "completed", second.problems()
    assert revision_of(result, "optimist") == REVISED_AFTER_PANEL + PANEL_SAYS
    (listed,) = result.payload["debateSubDebates"]
    assert (listed["debateId"], listed["status"]) == ("p1~sub-security-1", "completed")
    # Exactly one child: one request published, each of its calls made once.
    assert len(child_requests) == 1
    child_calls = calls_of(tmp_path, panel.pid)
    assert child_calls and set(child_calls.values()) == {1}, child_calls
    assert sum(calls_of(tmp_path, second.pid).values()) > 0  # the parent resumed there
    # A replay of the parent costs zero calls, its child's included.
    assert replay.payload["debateReplayed"] is True
    assert len(read_calls(tmp_path / "calls.log")) == calls
