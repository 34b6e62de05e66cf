"""Input no decoder can take is bad input at once: settled on its first delivery, no requeue loop."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tests.support.faults import (
    dlq_entries,
    pending,
    publish_requests,
    retrying,
    stream_results,
    wait_answered,
)
from tests.support.processes import WorkerProcess, env_for
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.redis]

DEPTH = 100_000


@pytest.mark.parametrize("where", ["payload", "whole body"])  # a failed event / a dead letter
async def test_100k_deep_json_is_settled_on_first_delivery(
        fault_redis: RedisServer, event_type: str, tmp_path: Path, workers: list[WorkerProcess],
        where: str) -> None:
    env = env_for(fault_redis.url, event_type, tmp_path)
    worker = WorkerProcess(env, tmp_path / "worker.log")
    workers.append(worker)
    # Deep where the schema allows any value, so the decoder must recurse (an array where an
    # object is expected would be refused before any depth is reached).
    if where == "payload":
        body = '{"requestId":"deep","payload":{"input":"x","n":' + "[" * DEPTH + "]" * DEPTH + "}}"
    else:
        body = '{"a":' * DEPTH + "1" + "}" * DEPTH
    with fault_redis.client() as r:
        retrying(lambda: r.xadd(event_type, {"envelope": body.encode()}))
    await asyncio.to_thread(publish_requests, fault_redis, event_type, [("after", {"input": "after"})])
    await wait_answered(fault_redis, event_type, ["after"], 30, worker)

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        failed = [e for e in (await asyncio.to_thread(stream_results, fault_redis, event_type)).failed
                  if e["requestId"] == "deep"]
        dead = await asyncio.to_thread(dlq_entries, fault_redis, event_type)
        if failed or dead:
            break
        await asyncio.sleep(0.2)
    assert len(failed) + len(dead) == 1, f"{len(failed)} failed events and {len(dead)} dead letters"
    if dead:
        deliveries = int(dead[0].get(b"deliveries", b"1"))
        reason = dead[0].get(b"reason", b"").decode()
        assert deliveries == 1, f"dead-lettered after {deliveries} deliveries ({reason})"
        assert "delivered" not in reason, f"dead-lettered as a crash loop, not as bad input: {reason}"
    assert await asyncio.to_thread(pending, fault_redis, event_type, env["DBB_GROUP"]) == 0
    log = worker.log.read_text(errors="replace")
    assert "Traceback" not in log and "handler error" not in log, (
        f"the worker treated bad input as a handler crash:\n{worker.log_tail()}")
    worker.assert_alive("after the deep JSON")
