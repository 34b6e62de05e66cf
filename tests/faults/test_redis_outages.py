"""Redis going away under a live worker: kill -9 and restart, dropped connections, pauses.

One worker subprocess serves the default handler (no explicit store: ``DebateBus`` makes it durable
with a Redis store on the broker's server). Each test then counts, from the streams themselves,
that every request was answered exactly once, nothing is left pending, and the worker never exited.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.support.faults import (
    assert_exactly_once,
    pending,
    publish_requests,
    stream_results,
    wait_answered,
)
from tests.support.processes import WorkerProcess, committed_round_reruns, env_for
from tests.support.quiet import settled_redis_group
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.redis]

N = 200


def _start(server: RedisServer, event_type: str, tmp_path: Path, workers: list[WorkerProcess],
           **knobs: object) -> tuple[WorkerProcess, dict[str, str]]:
    settings: dict[str, object] = {"DBB_DELAY": "0.015", "DBB_ROUNDS": 2, "DBB_CLAIM_IDLE_MS": 1500,
                                   **knobs}
    env = env_for(server.url, event_type, tmp_path, **settings)
    worker = WorkerProcess(env, tmp_path / "worker.log")
    workers.append(worker)
    return worker, env


def _requests(tag: str, n: int = N) -> list[tuple[str, dict[str, object]]]:
    return [(f"{tag}-{i}", {"input": f"{tag} topic {i}"}) for i in range(n)]


async def _settled_checks(server: RedisServer, event_type: str, env: dict[str, str],
                          worker: WorkerProcess, ids: list[str], timeout: float) -> None:
    await wait_answered(server, event_type, ids, timeout, worker, env["DBB_GROUP"])
    # Every request delivered and acked: none can run again, and a duplicate's result was
    # written before its request was acked.
    await settled_redis_group(server.url, event_type, env["DBB_GROUP"], timeout)
    results = await asyncio.to_thread(stream_results, server, event_type)
    assert_exactly_once(results, ids)
    stuck = await asyncio.to_thread(pending, server, event_type, env["DBB_GROUP"])
    assert stuck == 0, f"{stuck} entries left pending in {event_type}/{env['DBB_GROUP']}"
    worker.assert_alive("after every request was answered")


async def _until_completed(server: RedisServer, event_type: str, count: int,
                           worker: WorkerProcess) -> None:
    for _ in range(600):
        results = await asyncio.to_thread(stream_results, server, event_type)
        if len(results.all) >= count:
            return
        worker.assert_alive(f"before the fault, with {len(results.all)} results")
        await asyncio.sleep(0.05)
    raise AssertionError(f"the worker did not answer {count} requests in 30 s before the fault")


@pytest.mark.parametrize("outage_s", [0.3, 2.0, 20.0])
async def test_redis_kill9_and_restart_loses_nothing_and_keeps_the_worker(
        fault_redis: RedisServer, event_type: str, tmp_path: Path, workers: list[WorkerProcess],
        outage_s: float) -> None:
    worker, env = _start(fault_redis, event_type, tmp_path, workers)
    requests = _requests("kill9")
    ids = [rid for rid, _ in requests]
    await asyncio.to_thread(publish_requests, fault_redis, event_type, requests)
    await _until_completed(fault_redis, event_type, 30, worker)

    fault_redis.kill9()
    for _ in range(int(outage_s / 0.1) or 1):  # the worker must ride the outage out, not exit
        await asyncio.sleep(0.1)
        worker.assert_alive(f"during a {outage_s}s Redis outage")
    await asyncio.to_thread(fault_redis.restart_same_port)

    await _settled_checks(fault_redis, event_type, env, worker, ids, timeout=30)
    reruns = committed_round_reruns(tmp_path / "calls.log", interruptions=1)
    assert not reruns, f"{len(reruns)} debates re-ran a committed round, e.g. {list(reruns.items())[:2]}"
    for result in (await asyncio.to_thread(stream_results, fault_redis, event_type)).completed:
        rounds = [r["number"] for r in result["payload"]["debateTranscript"]]
        assert rounds == [1, 2], f"{result['requestId']}: transcript rounds {rounds}"


async def test_client_kill_every_2s_leaves_nothing_pending(
        fault_redis: RedisServer, event_type: str, tmp_path: Path,
        workers: list[WorkerProcess]) -> None:
    worker, env = _start(fault_redis, event_type, tmp_path, workers, DBB_CONCURRENCY=4,
                         DBB_DELAY="0.03")
    requests = _requests("ckill")
    ids = [rid for rid, _ in requests]
    with fault_redis.client_kill_loop(2.0) as killed:
        await asyncio.to_thread(publish_requests, fault_redis, event_type, requests)
        await wait_answered(fault_redis, event_type, ids, 50, worker)
    assert sum(killed) > 0, f"CLIENT KILL never killed a connection ({killed}): the fault did not happen"
    await _settled_checks(fault_redis, event_type, env, worker, ids, timeout=20)


async def test_redis_timeout_1_closes_idle_connections_and_nothing_is_lost(
        fault_redis: RedisServer, event_type: str, tmp_path: Path,
        workers: list[WorkerProcess]) -> None:
    fault_redis.config_set("timeout", "1")
    worker, env = _start(fault_redis, event_type, tmp_path, workers)
    first, second = _requests("idle-a", N // 2), _requests("idle-b", N // 2)
    await asyncio.to_thread(publish_requests, fault_redis, event_type, first)
    await wait_answered(fault_redis, event_type, [r for r, _ in first], 40, worker)
    await asyncio.sleep(2.5)  # every idle connection of the worker is closed by the server now
    await asyncio.to_thread(publish_requests, fault_redis, event_type, second)
    await _settled_checks(fault_redis, event_type, env, worker, [r for r, _ in first + second], 40)


@pytest.mark.parametrize("fault", ["sigstop", "client_pause"])
async def test_paused_redis_does_not_hang_the_worker(
        fault_redis: RedisServer, event_type: str, tmp_path: Path, workers: list[WorkerProcess],
        fault: str) -> None:
    worker, env = _start(fault_redis, event_type, tmp_path, workers)
    requests = _requests(fault, 100)
    ids = [rid for rid, _ in requests]
    await asyncio.to_thread(publish_requests, fault_redis, event_type, requests)
    await _until_completed(fault_redis, event_type, 20, worker)
    if fault == "sigstop":
        fault_redis.pause()
        await asyncio.sleep(3.0)
        fault_redis.resume()
    else:
        with fault_redis.client() as r:
            r.execute_command("CLIENT", "PAUSE", "3000", "ALL")
        await asyncio.sleep(3.0)
    await _settled_checks(fault_redis, event_type, env, worker, ids, timeout=40)
