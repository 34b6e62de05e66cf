"""Fault-test helpers: publishing requests with a plain synchronous redis client in the library's
wire format, and counting results from the result streams themselves (``XRANGE``), so a count
survives the very outages these tests cause."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis

from debatebus.client import request_message
from debatebus.schemas.envelope import completed_topic, failed_topic
from debatebus.transports._base import dlq_topic
from tests.support.processes import WorkerProcess
from tests.support.servers import RedisServer

T = TypeVar("T")

CALLS_PER_DEBATE = 8  # worker_app with 2 rounds and a judge: framing, 2×2 turns, 2 verdicts, synthesis


def retrying(fn: Callable[[], T], timeout: float = 30.0) -> T:
    """Run an inspection command, riding out the connection drops the test itself causes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def publish_requests(server: RedisServer, event_type: str,
                     requests: list[tuple[str, dict[str, Any]]]) -> None:
    """XADD ``(request_id, payload)`` pairs to the request stream in one pipeline."""
    with server.client() as r:
        pipe = r.pipeline(transaction=False)
        for rid, payload in requests:
            message = request_message(event_type, payload, request_id=rid)
            pipe.xadd(event_type, {"envelope": message.body, "key": rid})
        retrying(pipe.execute)


@dataclass
class StreamResults:
    """The result streams of one event type, read back with ``XRANGE``."""

    completed: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def all(self) -> list[dict[str, Any]]:
        return self.completed + self.failed

    def counts(self) -> Counter[str]:
        return Counter(e["requestId"] for e in self.all)

    def answered(self, ids: list[str]) -> int:
        counts = self.counts()
        return sum(1 for i in ids if counts[i] >= 1)

    def of(self, rid: str) -> list[dict[str, Any]]:
        return [e for e in self.all if e["requestId"] == rid]


def stream_results(server: RedisServer, event_type: str) -> StreamResults:
    def read() -> StreamResults:
        with server.client() as r:
            return StreamResults(
                [json.loads(f[b"envelope"]) for _, f in r.xrange(completed_topic(event_type))],
                [json.loads(f[b"envelope"]) for _, f in r.xrange(failed_topic(event_type))])

    return retrying(read)


def dlq_entries(server: RedisServer, event_type: str) -> list[dict[bytes, bytes]]:
    def read() -> list[dict[bytes, bytes]]:
        with server.client() as r:
            return [f for _, f in r.xrange(dlq_topic(event_type))]

    return retrying(read)


def pending(server: RedisServer, stream: str, group: str) -> int:
    """``XPENDING stream group``: entries delivered to the group and never acknowledged."""
    def read() -> int:
        with server.client() as r:
            return int(r.xpending(stream, group)["pending"])

    return retrying(read)


async def wait_answered(server: RedisServer, event_type: str, ids: list[str], timeout: float,
                        worker: WorkerProcess | None = None, group: str | None = None) -> StreamResults:
    """Poll the result streams until every id has a result; fail naming what is missing (and the
    worker's exit, when it died) otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        results = await asyncio.to_thread(stream_results, server, event_type)
        if results.answered(ids) == len(ids):
            return results
        if worker is not None:
            worker.assert_alive(f"with {results.answered(ids)} of {len(ids)} requests answered")
        if time.monotonic() > deadline:
            missing = [i for i in ids if results.counts()[i] == 0]
            held = f" ({pending(server, event_type, group)} pending in the group)" if group else ""
            log = f"; the worker's last warnings:\n{worker.problems()}" if worker else ""
            raise AssertionError(
                f"{results.answered(ids)} of {len(ids)} requests answered after {timeout}s{held}; "
                f"missing {missing[:10]}{'…' if len(missing) > 10 else ''}{log}")
        await asyncio.sleep(0.2)


def assert_exactly_once(results: StreamResults, ids: list[str]) -> None:
    counts = results.counts()
    twice = {i: counts[i] for i in ids if counts[i] > 1}
    assert not twice, f"{len(twice)} requests answered more than once: {dict(list(twice.items())[:10])}"
    failed = [(e["requestId"], e["payload"].get("debateError")) for e in results.failed]
    assert not failed, f"{len(failed)} requests failed, e.g. {failed[:3]}"
