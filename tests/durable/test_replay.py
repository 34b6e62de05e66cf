"""Ops replay of a request topic: every finished debate is answered from the store for free."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from typing import Any

import pytest
from tests.support.bus import make_debate, running

from debatebus._worker import DebateBus
from debatebus.checkpoints import MemoryCheckpointStore, store_from_url
from debatebus.cli._ops_cmds import parse_position, replay_range
from debatebus.client import BusClient
from debatebus.handlers._checkpointing import debate_key
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM
from debatebus.transports import transport_from_url


def counting_llm() -> tuple[FunctionLLM, list[str]]:
    calls: list[str] = []

    def answer(request: LLMRequest) -> Any:
        calls.append(request.purpose)
        return {"consensus": True, "summary": "s"} if request.purpose == "judge" else "text"

    return FunctionLLM(answer), calls


async def _answered(client: BusClient, event_type: str, n: int) -> list[Any]:
    results = await client.results(event_type)
    got = []
    async with asyncio.timeout(60):
        async for envelope in results:
            got.append(envelope)
            if len(got) == n:
                return got
    raise AssertionError("unreachable")


@pytest.mark.parametrize("url_kind", ["memory", "redis_streams"])
async def test_reemitting_a_topic_costs_no_llm_call_for_finished_debates(
        url_kind: str, request: pytest.FixtureRequest) -> None:
    url = "memory://" if url_kind == "memory" else request.getfixturevalue("redis_server").url
    event_type = f"debate:replay{uuid.uuid4().hex[:6]}"
    llm, calls = counting_llm()
    store = MemoryCheckpointStore()
    app = DebateBus(url)
    app.subscribe(event_type, make_debate(llm).as_handler(store=store))
    async with running(app), BusClient(url) as client:
        listener = asyncio.create_task(_answered(client, event_type, 5))
        await asyncio.sleep(0.1)
        for i in range(5):
            await client.publish(event_type, {"input": f"t{i}"}, request_id=f"r{i}")
        first = await listener
        paid = len(calls)
        listener = asyncio.create_task(_answered(client, event_type, 5))
        await asyncio.sleep(0.1)
        summary = await replay_range(client.transport, event_type, reemit=True)
        second = await listener
    assert {e.request_id for e in first} == {e.request_id for e in second} == {f"r{i}" for i in range(5)}
    assert all(e.payload["debateReplayed"] for e in second)
    assert len(calls) == paid, "a replayed finished debate must not call the model"
    assert (summary.read, summary.republished) == (5, 5)


async def test_a_replay_skips_what_workers_finished(redis_server: Any) -> None:
    event_type = f"debate:replay{uuid.uuid4().hex[:6]}"
    llm, _ = counting_llm()
    store = store_from_url(redis_server.url)
    app = DebateBus(redis_server.url)
    app.subscribe(event_type, make_debate(llm).as_handler(store=store))
    async with running(app), BusClient(redis_server.url) as client, store:
        listener = asyncio.create_task(_answered(client, event_type, 3))
        await asyncio.sleep(0.1)
        for i in range(3):
            await client.publish(event_type, {"input": f"t{i}"}, request_id=f"r{i}")
        await listener
        summary = await replay_range(client.transport, event_type, store=store, dry_run=True)
    assert [e.action for e in summary.entries] == ["skip-finished"] * 3


def test_positions_are_parsed_for_each_broker() -> None:
    assert parse_position(None) is None
    assert parse_position("42") == 42
    assert parse_position("1700000000000-3") == "1700000000000-3"
    assert parse_position("2026-11-30T07:00:00Z").year == 2026  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="give a stream id"):
        parse_position("yesterday")


async def test_replay_cli_prints_a_summary(redis_server: Any) -> None:
    event_type = f"debate:cli{uuid.uuid4().hex[:6]}"
    store = store_from_url(redis_server.url)
    async with transport_from_url(redis_server.url) as transport, store:
        client = BusClient(transport)
        await client.publish(event_type, {"input": "a"}, request_id="x1")
        await client.publish(event_type, {"input": "b"}, request_id="x2")
        await store.put_result(debate_key(event_type, "x1"), b'{"debateStatus": "completed"}')
    out = await asyncio.to_thread(subprocess.run, [
        sys.executable, "-m", "debatebus", "replay", event_type, "--broker", redis_server.url],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("read 2: re-published 1, of which 0 answered from the store at "
                                 "no LLM cost and 1 run; skipped 1 finished")
