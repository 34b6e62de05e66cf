"""Worker heartbeats and ``debatebus check`` (a subprocess, as a container healthcheck runs it)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from tests.observability.observed import debatebus_check
from tests.support.bus import make_debate, running, transport_options
from tests.support.processes import WorkerProcess
from tests.support.servers import free_port

from debatebus._worker import DebateBus
from debatebus.cli._observe_cmds import check, judge
from debatebus.exceptions import TransportError
from debatebus.observability._heartbeat import (
    HEARTBEAT_TOPIC,
    beat_forever,
    heartbeat_key,
    latest_heartbeat,
    send_last_beat,
)
from debatebus.transports import Delivery, MemoryTransport, Outgoing, Transport
from debatebus.transports._base import HEARTBEAT_STREAM_MAXLEN

WAIT = 60.0


async def first_heartbeat(url: str, group: str, consumer: str | None = None,
                          process: WorkerProcess | None = None) -> dict[str, Any]:
    async with asyncio.timeout(WAIT):
        while True:
            beat = await latest_heartbeat(url, group, consumer)
            if beat is not None:
                return beat
            if process is not None:
                process.assert_alive("before its first heartbeat")
            await asyncio.sleep(0.05)


def worker(url: str, group: str, interval_s: float = 0.2, consumer: str = "c-1") -> DebateBus:
    app = DebateBus(url, group=group, consumer=consumer, transport_options=transport_options(url),
                    heartbeat_interval_s=interval_s)
    app.subscribe(f"debate:request{uuid.uuid4().hex[:8]}", make_debate().as_handler())
    return app


@pytest.mark.redis
async def test_check_fails_without_a_worker(redis_server: Any) -> None:
    code, line = await debatebus_check("--broker", redis_server.url, "--group", "nobody-here")
    assert code == 1
    assert line.startswith("unhealthy: no heartbeat from group 'nobody-here'")
    assert len(line.splitlines()) == 1


@pytest.mark.redis
@pytest.mark.parametrize("scheme", ["redis://", "redis+pubsub://"])
async def test_check_passes_while_a_worker_runs(redis_server: Any, scheme: str) -> None:
    url, group = redis_server.url.replace("redis://", scheme), f"g-{uuid.uuid4().hex[:8]}"
    async with running(worker(url, group)):
        beat = await first_heartbeat(url, group)
        code, line = await debatebus_check("--broker", url, "--group", group, "--max-age", "300")
        # Checking through the other Redis scheme finds the beats too (stream and key are read).
        other = url.replace("+pubsub", "") if "+pubsub" in url else url.replace("redis", "redis+pubsub", 1)
        other_code, _ = await check(other, group, max_age=300)
    assert (code, other_code) == (0, 0)
    assert line.startswith("ok: c-1 ")
    assert f"group '{group}'" in line
    assert beat["group"] == group
    assert beat["consumer"] == "c-1"
    assert beat["pid"] == os.getpid()
    assert beat["inFlight"] == 0
    assert beat["intervalS"] == 0.2
    assert beat["app"] == "debatebus"


@pytest.mark.redis
async def test_pubsub_heartbeat_is_a_key_with_an_expiry(redis_server: Any) -> None:
    url, group = redis_server.url.replace("redis://", "redis+pubsub://"), f"g-{uuid.uuid4().hex[:8]}"
    async with running(worker(url, group)):
        await first_heartbeat(url, group)
        client = Redis.from_url(redis_server.url)
        try:
            ttl = await client.ttl(heartbeat_key(group))
            body = json.loads(await client.get(heartbeat_key(group)))
        finally:
            await client.aclose()
    assert 0 < ttl <= 60
    assert body["group"] == group


@pytest.mark.redis
async def test_newest_beat_of_a_group_under_other_groups(redis_server: Any) -> None:
    """Many other groups' beats on top of ours: the reader pages back to find it."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    client = Redis.from_url(redis_server.url)
    try:
        mine = {"group": group, "timestamp": 1.0, "consumer": "old"}
        await client.xadd(HEARTBEAT_TOPIC, {"envelope": json.dumps(mine)})
        for n in range(250):
            other = {"group": f"other-{n % 7}", "timestamp": 2.0 + n}
            await client.xadd(HEARTBEAT_TOPIC, {"envelope": json.dumps(other)})
        await client.xadd(HEARTBEAT_TOPIC, {"envelope": b"not a heartbeat"})
    finally:
        await client.aclose()
    assert await latest_heartbeat(redis_server.url, group) == mine


@pytest.mark.redis
async def test_stream_of_beats_is_trimmed(redis_server: Any) -> None:
    from debatebus.transports._redis_streams import RedisStreamsTransport

    sent = 0

    def count() -> int:  # called once per beat
        nonlocal sent
        sent += 1
        return 0

    async with RedisStreamsTransport(redis_server.url) as transport:
        task = asyncio.create_task(beat_forever(transport, "trim", "c", 0.001, count))
        async with asyncio.timeout(WAIT):
            while sent < HEARTBEAT_STREAM_MAXLEN + 500:
                assert not task.done()
                await asyncio.sleep(0.05)
        task.cancel()
        client = Redis.from_url(redis_server.url)
        try:
            length = await client.xlen(HEARTBEAT_TOPIC)
        finally:
            await client.aclose()
    # Approximate trimming keeps about HEARTBEAT_STREAM_MAXLEN: whole macro nodes of 100 entries.
    assert length < HEARTBEAT_STREAM_MAXLEN + 200


@pytest.mark.kafka
async def test_check_on_kafka(tansu_server: Any) -> None:
    url, group = tansu_server.url, f"g-{uuid.uuid4().hex[:8]}"
    async with running(worker(url, group)):
        beat = await first_heartbeat(url, group)
        code, line = await check(url, group, max_age=300)
    assert code == 0, line
    assert beat["group"] == group
    assert (await check(url, "nobody-here"))[0] == 1


async def test_check_on_memory_and_unreachable_brokers_says_why() -> None:
    code, line = await check("memory://", "g")
    assert code == 1
    assert "memory://" in line
    code, line = await check(f"redis://:s3cret-pass@127.0.0.1:{free_port()}/0", "g", timeout=20)
    assert code == 1
    assert line.startswith("unhealthy: ")
    assert "s3cret-pass" not in line


async def test_memory_worker_sends_no_heartbeat() -> None:
    transport = MemoryTransport()
    await asyncio.wait_for(beat_forever(transport, "g", "c", 0.01, lambda: 0), 5)


def test_judge() -> None:
    beat = {"group": "g", "consumer": "c", "pid": 7, "host": "h", "inFlight": 2,
            "intervalS": 5.0, "timestamp": 1000.0}
    assert judge(beat, "g", "redis://r", None, now=1014.0)[0] == 0  # within 3 × 5 s
    code, line = judge(beat, "g", "redis://r", None, now=1016.0)
    assert code == 1
    assert "16.0 s old (limit 15 s)" in line
    assert judge(beat, "g", "redis://r", 60.0, now=1059.0)[0] == 0
    assert judge(beat, "g", "redis://r", None, now=900.0)[0] == 0  # worker's clock ahead
    assert judge(None, "g", "redis://r", None, now=0.0)[0] == 1
    code, line = judge({**beat, "connected": False}, "g", "redis://r", None, now=1001.0)
    assert code == 1
    assert "disconnected from the broker" in line


class Beats(Transport):
    """A transport the heartbeat publishes to as it would to Kafka: records every beat, and can
    refuse the next ``failing`` ones."""

    def __init__(self) -> None:
        self.beats: list[dict[str, Any]] = []
        self.failing = 0

    async def publish(self, message: Outgoing) -> str:
        if self.failing:
            self.failing -= 1
            raise TransportError("broker down")
        self.beats.append(json.loads(message.body))
        return ""

    async def close(self) -> None:
        raise NotImplementedError

    def consume(self, topics: Sequence[str], *, group: str, consumer: str,
                prefetch: int = 16) -> AsyncIterator[Delivery]:
        raise NotImplementedError

    async def ack(self, delivery: Delivery, results: Sequence[Outgoing] = ()) -> None:
        raise NotImplementedError

    async def reject(self, delivery: Delivery, reason: str, *, requeue: bool = False) -> None:
        raise NotImplementedError

    async def subscribe(self, topics: Sequence[str]) -> AsyncIterator[Delivery]:
        raise NotImplementedError


@pytest.fixture
def kafka_like() -> Beats:
    return Beats()


async def beats(transport: Beats, count: int) -> None:
    async with asyncio.timeout(WAIT):
        while True:
            if len(transport.beats) >= count:
                return
            await asyncio.sleep(0.01)


async def test_beats_say_whether_connected_and_a_wake_beats_at_once(kafka_like: Beats) -> None:
    up, wake = [False], asyncio.Event()
    task = asyncio.create_task(beat_forever(kafka_like, "g", "c", 3600, lambda: 2,
                                            connected=lambda: up[0], wake=wake))
    try:
        await beats(kafka_like, 1)
        up[0] = True
        wake.set()  # a reconnected worker does not wait an interval to say so
        await beats(kafka_like, 2)
    finally:
        task.cancel()
    assert [b["connected"] for b in kafka_like.beats] == [False, True]
    assert kafka_like.beats[0]["inFlight"] == 2


async def test_heartbeat_outage_is_logged_once(kafka_like: Beats,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="debatebus")
    kafka_like.failing = 5
    task = asyncio.create_task(beat_forever(kafka_like, "g", "c", 0.01, lambda: 0))
    try:
        await beats(kafka_like, 1)
    finally:
        task.cancel()
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "debatebus.heartbeat"]
    assert [level for level, _ in logged] == ["WARNING", "INFO"]
    assert "broker down" in logged[0][1]


async def test_last_beat_says_stopping(kafka_like: Beats) -> None:
    await send_last_beat(kafka_like, "g", "c", 5.0)
    (beat,) = kafka_like.beats
    assert beat["stopping"] is True and beat["consumer"] == "c"


@pytest.mark.redis
@pytest.mark.parametrize("scheme", ["redis://", "redis+pubsub://"])
async def test_check_fails_as_soon_as_the_worker_stops(redis_server: Any, scheme: str) -> None:
    url, group = redis_server.url.replace("redis://", scheme), f"g-{uuid.uuid4().hex[:8]}"
    async with running(worker(url, group, interval_s=30)) as app:
        beat = await first_heartbeat(url, group)
        assert beat["connected"] is True
        assert (await check(url, group))[0] == 0
        app.stop()
        async with asyncio.timeout(WAIT):  # the last beat is written before the drain
            while True:
                code, line = await check(url, group)
                if code == 1:
                    break
                await asyncio.sleep(0.05)
    assert code == 1
    assert line.startswith(f"unhealthy: no heartbeat from group '{group}'")


@pytest.mark.redis
async def test_a_stopped_consumer_does_not_hide_a_live_one(redis_server: Any) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    client = Redis.from_url(redis_server.url)
    try:
        for beat in ({"group": group, "consumer": "a", "timestamp": 1.0},
                     {"group": group, "consumer": "b", "timestamp": 2.0},
                     {"group": group, "consumer": "b", "timestamp": 3.0, "stopping": True}):
            await client.xadd(HEARTBEAT_TOPIC, {"envelope": json.dumps(beat)})
        assert (await latest_heartbeat(redis_server.url, group) or {}).get("consumer") == "a"
        stop_a = {"group": group, "consumer": "a", "timestamp": 4.0, "stopping": True}
        await client.xadd(HEARTBEAT_TOPIC, {"envelope": json.dumps(stop_a)})
        assert await latest_heartbeat(redis_server.url, group) is None
    finally:
        await client.aclose()


# ---- one worker: check --consumer --------------------------------------------------------------


def test_judge_names_the_consumer_asked_about() -> None:
    beat = {"group": "g", "consumer": "c", "pid": 7, "host": "h", "intervalS": 5.0,
            "timestamp": 1000.0}
    code, line = judge(None, "g", "redis://r", None, now=0.0, consumer="c")
    assert code == 1
    assert line.startswith("unhealthy: no live heartbeat from consumer 'c' of group 'g' on redis://r")
    code, line = judge(beat, "g", "redis://r", None, now=1016.0, consumer="c")
    assert code == 1
    assert "heartbeat of consumer 'c' in group 'g' is 16.0 s old (limit 15 s)" in line
    assert judge(beat, "g", "redis://r", None, now=1001.0, consumer="c") == \
        (0, "ok: c (pid 7 on h) in group 'g' beat 1.0 s ago, 0 debates in flight")


@pytest.mark.redis
@pytest.mark.parametrize("scheme", ["redis://", "redis+pubsub://"])
async def test_check_one_consumer_of_two(redis_server: Any, scheme: str) -> None:
    """Two workers of one group: each is checked on its own heartbeats, and the one that stopped
    is unhealthy while the other and the group stay healthy."""
    url, group = redis_server.url.replace("redis://", scheme), f"g-{uuid.uuid4().hex[:8]}"
    async with running(worker(url, group, 30, "c-1")) as first, \
            running(worker(url, group, 30, "c-2")):
        for name in ("c-1", "c-2"):
            assert (await first_heartbeat(url, group, name))["consumer"] == name
        code, line = await check(url, group, consumer="c-1")
        assert (code, line.split(" (")[0]) == (0, "ok: c-1")
        first.stop()  # its last beat says so: c-1 is unhealthy at once
        async with asyncio.timeout(WAIT):
            while True:
                code, line = await check(url, group, consumer="c-1")
                if code == 1:
                    break
                await asyncio.sleep(0.05)
        assert line.startswith(f"unhealthy: no live heartbeat from consumer 'c-1' of group '{group}'")
        code, line = await check(url, group, consumer="c-2")
        assert (code, line.split(" (")[0]) == (0, "ok: c-2")
        assert (await check(url, group))[1].startswith("ok: c-2 ")
        assert (await check(url, group, consumer="nobody"))[0] == 1


@pytest.fixture
def processes() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for process in started:
        process.stop()


@pytest.mark.redis
@pytest.mark.slow
async def test_check_consumer_turns_unhealthy_when_its_worker_is_killed(
        redis_server: Any, tmp_path: Path, processes: list[WorkerProcess]) -> None:
    """Two worker processes of one group, named by ``$DEBATEBUS_CONSUMER`` and by ``--consumer``.
    One is SIGKILLed (no last beat): ``check --consumer`` of it turns unhealthy once its newest
    beat is older than 3 heartbeat intervals (3 s here), while the other's stays healthy, as does
    the group's (the case a group-wide check cannot see)."""
    url, group = redis_server.url, f"g-{uuid.uuid4().hex[:8]}"
    env = {"DBB_BROKER": url, "DBB_EVENT_TYPE": f"debate:request{uuid.uuid4().hex[:8]}",
           "DBB_GROUP": group, "DBB_HEARTBEAT_INTERVAL": "1"}
    doomed = WorkerProcess({**env, "DEBATEBUS_CONSUMER": "doomed"}, tmp_path / "doomed.log")
    processes.append(doomed)
    survivor = WorkerProcess(env, tmp_path / "survivor.log", ["--consumer", "survivor"])
    processes.append(survivor)
    for name, process in (("doomed", doomed), ("survivor", survivor)):
        beat = await first_heartbeat(url, group, name, process)
        assert (beat["consumer"], beat["pid"]) == (name, process.pid)
    assert (await debatebus_check("--broker", url, "--group", group, "--consumer", "doomed"))[0] == 0
    doomed.kill()
    others = []
    async with asyncio.timeout(15):  # the limit is 3 s: "within seconds" of the kill
        while True:
            if (await check(url, group, consumer="doomed"))[0] == 1:
                break
            others.append(await check(url, group, consumer="survivor"))
            await asyncio.sleep(0.2)
    assert all(code == 0 for code, _ in others), others
    code, line = await debatebus_check("--broker", url, "--group", group, "--consumer", "doomed")
    assert code == 1
    assert line.startswith(f"unhealthy: the newest heartbeat of consumer 'doomed' in group '{group}'")
    assert "(limit 3 s)" in line
    code, line = await debatebus_check("--broker", url, "--group", group, "--consumer", "survivor")
    assert (code, line.split(" (")[0]) == (0, "ok: survivor")
    assert (await debatebus_check("--broker", url, "--group", group))[0] == 0
    survivor.assert_alive("after the other worker was killed")


async def test_check_on_kafka_answers_within_its_timeout() -> None:
    """A port that takes connections and never answers (a broker that hangs, a firewall that
    holds them): the check gives up at its timeout, its connections closed, and says so."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        code, line = await check(f"kafka://127.0.0.1:{port}", "g", timeout=2.0)
        took = loop.time() - started
    finally:
        server.close()
        for writer in held:
            writer.close()
    assert (code, line) == (1, f"unhealthy: the broker at kafka://127.0.0.1:{port} did not "
                               "answer within 2 s")
    assert held  # it did connect: the wait was for an answer
    assert took < 2.0 + 1.0, took  # the timeout bounds the whole check, closing included
    # Nothing listening at all: refused at once, with the reason.
    code, line = await check(f"kafka://127.0.0.1:{free_port()}", "g", timeout=20.0)
    assert code == 1
    assert "is a broker listening there?" in line
