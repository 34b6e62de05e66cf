"""``debatebus replay`` on Kafka (Tansu): offsets count in each partition, ``--partition`` picks
some, a Redis stream id or a range ending before it starts is a one-line error, a dead letter
goes back onto its origin topic and is answered, and no store means none was consulted."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.support.bus import running
from tests.support.servers import TansuServer

from debatebus._worker import DebateBus
from debatebus.cli import main
from debatebus.cli._ops_cmds import replay_range
from debatebus.client import BusClient
from debatebus.exceptions import ConfigError
from debatebus.transports import dlq_topic
from debatebus.transports._base import DEAD_LETTER_HEADERS, ORIGIN_HEADER, REASON_HEADER
from debatebus.transports.kafka import KafkaTransport

pytestmark = pytest.mark.kafka

GROUP_OPTIONS: dict[str, Any] = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}


@pytest.fixture
def event_type() -> str:
    return f"debate:kops{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def kafka(tansu_server: TansuServer) -> AsyncIterator[KafkaTransport]:
    async with KafkaTransport(tansu_server.bootstrap, partitions=3, **GROUP_OPTIONS) as t:
        yield t


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_offsets_count_in_each_partition_and_partitions_can_be_picked(
        kafka: KafkaTransport, event_type: str, tansu_server: TansuServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    client = BusClient(kafka)
    await kafka.ensure_topics([event_type])
    where = {}
    for i in range(12):
        await client.publish(event_type, {"input": f"q{i}"}, request_id=f"r{i}")
    async for delivery in kafka.read_range(event_type):
        where[delivery.key] = delivery.id
    per_partition = Counter(position.split(":")[0] for position in where.values())
    assert len(per_partition) > 1, where  # spread by key over the partitions

    summary = await replay_range(kafka, event_type, start=1, end=1, dry_run=True)
    assert sorted(e.id for e in summary.entries) == sorted(
        f"{p}:1" for p, n in per_partition.items() if n > 1)  # offset 1 of every partition

    code, out, err = await asyncio.to_thread(
        run_cli, capsys, "replay", event_type, "--dry-run", "--partition", "1",
        "--broker", tansu_server.url)
    assert code == 0, err
    listed = out.splitlines()[:-1]
    assert sorted(line.split("  ")[0] for line in listed) == sorted(
        position for position in where.values() if position.startswith("1:"))
    assert all(line.endswith("re-publish (no store consulted)") for line in listed)
    assert "checkpoint store not consulted" in out.splitlines()[-1]

    with pytest.raises(ConfigError, match="has partitions 0, 1, 2: there is no partition 7"):
        await replay_range(kafka, event_type, partitions=[7], dry_run=True)


@pytest.mark.parametrize(("argv", "says"), [
    (["--from", "1700000000000-0"], "'1700000000000-0' is a Redis stream id: on Kafka give an "
                                    "offset (42, counted in each partition) or an ISO time"),
    (["--from", "5", "--to", "2"], "the range ends before it starts (2 comes before 5)"),
    (["--from", "2026-11-30T08:00:00Z", "--to", "2026-11-30T07:00:00Z"],
     "the range ends before it starts"),
    (["--failed"], "needs the checkpoint store"),
])
async def test_bad_ranges_are_one_line_errors(
        kafka: KafkaTransport, event_type: str, tansu_server: TansuServer,
        capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    await kafka.ensure_topics([event_type])
    code, _, err = await asyncio.to_thread(
        run_cli, capsys, "replay", event_type, *argv, "--broker", tansu_server.url)
    assert code == 2
    assert says in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


async def test_a_dead_letter_goes_back_to_its_origin_and_is_answered(
        tansu_server: TansuServer, kafka: KafkaTransport, event_type: str) -> None:
    calls: list[str] = []

    async def flaky(payload: dict[str, Any]) -> dict[str, Any]:
        calls.append(payload["input"])
        if len(calls) == 1:
            raise RuntimeError("the provider is down")
        return {"answer": payload["input"].upper()}

    dlq = dlq_topic(event_type)
    app = DebateBus(tansu_server.url, group=f"g-{uuid.uuid4().hex[:6]}", max_deliveries=1,
                    transport_options=GROUP_OPTIONS)
    app.subscribe(event_type, flaky)
    await kafka.ensure_topics([event_type, dlq])
    async with running(app), BusClient(kafka) as client:
        results = await client.results(event_type)
        await client.publish(event_type, {"input": "hello"}, request_id="r-dead")
        async with asyncio.timeout(60):  # handed out again once, then dead-lettered
            while not (letters := [d async for d in kafka.read_range(dlq)]):  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert letters[0].headers[ORIGIN_HEADER] == event_type
        assert REASON_HEADER in letters[0].headers

        summary = await replay_range(kafka, dlq)
        async with asyncio.timeout(60):
            answer = await anext(aiter(results))
        requests = [d async for d in kafka.read_range(event_type)]
        assert len([d async for d in kafka.read_range(dlq)]) == 1  # none went back onto the DLQ
    assert (summary.republished, summary.dead_letters) == (1, 1)
    assert (answer.request_id, answer.payload["answer"]) == ("r-dead", "HELLO")
    assert calls == ["hello", "hello"]
    assert [d.body for d in requests] == [letters[0].body] * 2
    assert requests[-1].key == "r-dead"
    assert not DEAD_LETTER_HEADERS & set(requests[-1].headers)
