"""``debatebus failures``: an event type's recent failed results and dead letters, with time,
requestId and reason, newest last and redacted, on Redis Streams and Kafka; a clear error on
Redis pub/sub, which keeps no history."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from tests.support.bus import make_debate, running
from tests.support.servers import RedisServer, TansuServer

from debatebus._redaction import REDACTED
from debatebus._worker import DebateBus
from debatebus.cli import main
from debatebus.cli._ops_cmds import list_failures, parse_since
from debatebus.client import BusClient
from debatebus.exceptions import ConfigError
from debatebus.schemas.envelope import ENVELOPE_ENCODER, Envelope, failed_topic
from debatebus.transports import Outgoing, Transport, dlq_topic, transport_from_url
from debatebus.transports._base import ORIGIN_HEADER, REASON_HEADER
from debatebus.transports.kafka import KafkaTransport

SECRET = "sk-live1234567890abcdef"


@pytest.fixture
def event_type() -> str:
    return f"debate:fails{uuid.uuid4().hex[:8]}"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def failed_result(request_id: str, error: str) -> bytes:
    return ENVELOPE_ENCODER.encode(Envelope(request_id=request_id, payload={
        "input": "q", "debateStatus": "failed", "debateError": error}))


async def wait_for(transport: Transport, topic: str, n: int) -> None:
    async with asyncio.timeout(30):
        while len([d async for d in transport.read_range(topic)]) < n:  # noqa: ASYNC110 - polling
            await asyncio.sleep(0.05)


def test_since_takes_durations_and_times() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert parse_since("30m", now) == now - timedelta(minutes=30)
    assert parse_since("1h", now) == now - timedelta(hours=1)
    assert parse_since("2d", now) == now - timedelta(days=2)
    assert parse_since("2026-11-30T07:00:00Z", now) == datetime(2026, 11, 30, 7, tzinfo=UTC)
    for bad in ("yesterday", "-1h", "0m"):
        with pytest.raises(ConfigError, match=r"give a duration \(30m, 1h, 2d\) or an ISO time"):
            parse_since(bad, now)


@pytest.mark.redis
async def test_failures_and_dead_letters_of_a_worker_newest_last(
        redis_server: RedisServer, event_type: str, capsys: pytest.CaptureFixture[str]) -> None:
    app = DebateBus(redis_server.url, group=f"g-{uuid.uuid4().hex[:6]}",
                    transport_options={"block_ms": 100})
    app.subscribe(event_type, make_debate().as_handler())
    async with running(app), BusClient(redis_server.url) as client:
        await client.publish(event_type, {"question": "no input field"}, request_id="r-bad")
        await wait_for(client.transport, failed_topic(event_type), 1)
        await client.transport.publish(Outgoing(event_type, b"{not json"))
        await wait_for(client.transport, dlq_topic(event_type), 1)
        # Failures are ordered by their entries' times (milliseconds): the next one must be
        # stamped after the dead letter, not in its millisecond (which stream is read first
        # would then decide).
        (dead,) = [d async for d in client.transport.read_range(dlq_topic(event_type))]
        while time.time() * 1000 <= int(dead.id.split("-")[0]) + 1:  # noqa: ASYNC110 - the clock
            await asyncio.sleep(0.001)
        await client.transport.publish(Outgoing(failed_topic(event_type),
                                                failed_result("r-key", f"401 for key {SECRET}")))
        found = await list_failures(client.transport, event_type, since=parse_since("1h"))
    assert [(f.kind, f.request_id) for f in found] == [
        ("failed", "r-bad"), ("dead-letter", None), ("failed", "r-key")]
    assert "payload.input" in found[0].reason
    assert found[1].reason and found[1].reason != "(no reason recorded)"
    assert SECRET not in found[2].reason and "sk-" in found[2].reason
    assert all(f.time is not None and f.time > datetime.now(UTC) - timedelta(minutes=1)
               for f in found)
    assert [f.time for f in found] == sorted(f.time for f in found if f.time is not None)

    code, out, err = await asyncio.to_thread(run_cli, capsys, "failures", event_type, "--since",
                                             "1h", "--limit", "2", "--broker", redis_server.url)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "(older ones left out: the newest 2 are shown; raise --limit)"
    assert lines[1].split("  ")[1:3] == ["dead-letter", "-"]
    assert lines[2].split("  ")[1:] == ["failed", "r-key", f"401 for key sk-{REDACTED}"]
    assert SECRET not in out


@pytest.mark.redis
async def test_since_leaves_out_older_failures(redis_server: RedisServer, event_type: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    async with transport_from_url(redis_server.url) as transport:
        old_id = await transport.publish(Outgoing(failed_topic(event_type),
                                                  failed_result("r-old", "old")))
        old_ms = int(old_id.split("-")[0])
        # The next entry's id is a later millisecond.
        while time.time() * 1000 <= old_ms + 1:  # noqa: ASYNC110 - the clock, not a task
            await asyncio.sleep(0.001)
        await transport.publish(Outgoing(failed_topic(event_type), failed_result("r-new", "new")))
        since = datetime.fromtimestamp((old_ms + 1) / 1000, UTC)
        found = await list_failures(transport, event_type, since=since)
        assert [f.request_id for f in found] == ["r-new"]
        assert [f.request_id for f in await list_failures(transport, event_type)] == [
            "r-old", "r-new"]
    code, out, _ = await asyncio.to_thread(run_cli, capsys, "failures", f"{event_type}x",
                                           "--broker", redis_server.url)
    assert code == 0 and out.startswith(f"no failed results or dead letters of {event_type}x")


@pytest.mark.redis
async def test_on_pubsub_it_says_there_is_no_history(
        redis_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    url = redis_server.url.replace("redis://", "redis+pubsub://")
    code, _, err = await asyncio.to_thread(run_cli, capsys, "failures", "debate:request",
                                             "--broker", url)
    assert code == 2
    assert "keeps no history to read: replay and failures work on Redis Streams and Kafka" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.kafka
async def test_on_kafka_by_record_time(tansu_server: TansuServer, event_type: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    async with KafkaTransport(tansu_server.bootstrap) as kafka:
        assert await list_failures(kafka, event_type) == []  # no such topics yet: none failed
        await kafka.publish(Outgoing(failed_topic(event_type), failed_result("r-old", "old")))
        (old,) = [d async for d in kafka.read_range(failed_topic(event_type))]
        assert old.timestamp_ms is not None
        while time.time() * 1000 <= old.timestamp_ms + 1:  # noqa: ASYNC110 - the clock
            await asyncio.sleep(0.001)
        since = datetime.fromtimestamp((old.timestamp_ms + 1) / 1000, UTC)
        await kafka.publish(Outgoing(failed_topic(event_type), failed_result("r-new", "new")))
        await kafka.publish(Outgoing(dlq_topic(event_type), b"{not json", headers={
            REASON_HEADER: "cannot decode the envelope", ORIGIN_HEADER: event_type}))
        found = await list_failures(kafka, event_type, since=since)
    assert [(f.kind, f.request_id, f.reason) for f in found] == [
        ("failed", "r-new", "new"), ("dead-letter", None, "cannot decode the envelope")]
    code, out, err = await asyncio.to_thread(run_cli, capsys, "failures", event_type,
                                             "--since", "1h", "--broker", tansu_server.url)
    assert code == 0, err
    assert [line.split("  ")[2] for line in out.splitlines()] == ["r-old", "r-new", "-"]
