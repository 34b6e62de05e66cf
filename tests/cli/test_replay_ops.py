"""``debatebus replay`` after an incident, on a real Redis: a dry run changes nothing and says
what would run, what the store answers and what is skipped; finished requests are skipped unless
re-emitted; ``--failed`` and ``--rerun``; dead letters go back onto their origin topic."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from tests.support.bus import running
from tests.support.servers import RedisServer

from debatebus._worker import DebateBus
from debatebus.checkpoints import Counters, store_from_url
from debatebus.cli import main
from debatebus.cli._ops_cmds import ReplaySummary, replay_range
from debatebus.client import BusClient, request_message
from debatebus.exceptions import ConfigError
from debatebus.handlers._checkpointing import debate_key
from debatebus.transports import Outgoing, Transport, dlq_topic, transport_from_url
from debatebus.transports._base import ORIGIN_HEADER, REASON_HEADER

pytestmark = pytest.mark.redis

COMPLETED = b'{"debateStatus": "completed", "debateOutput": "done"}'
FAILED = b'{"debateStatus": "failed", "debateError": "provider timed out"}'
FAILED_FINAL = b'{"debateStatus": "failed", "debateError": "budget reached", "debateRetryable": false}'


@pytest.fixture
def event_type() -> str:
    return f"debate:ops{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def transport(redis_server: RedisServer) -> AsyncIterator[Transport]:
    async with transport_from_url(redis_server.url) as t:
        yield t


@pytest.fixture
async def seeded(redis_server: RedisServer, transport: Transport, event_type: str
                 ) -> AsyncIterator[Any]:
    """Seven requests on ``event_type`` and what the store holds for them: completed, failed for
    good, failed (retryable), a committed checkpoint, nothing, one asking to rerun, and a body
    with no requestId."""
    client = BusClient(transport)
    for rid in ("done", "final", "failed", "ckpt", "new"):
        await client.publish(event_type, {"input": rid}, request_id=rid)
    await client.publish(event_type, {"input": "again", "replay": "rerun"}, request_id="rerun")
    await transport.publish(Outgoing(event_type, b"not json at all"))
    async with store_from_url(redis_server.url) as store:
        await store.put_result(debate_key(event_type, "done"), COMPLETED)
        await store.put_result(debate_key(event_type, "final"), FAILED_FINAL)
        await store.put_result(debate_key(event_type, "failed"), FAILED)
        await store.begin(debate_key(event_type, "ckpt"), b"header")
        await store.append(debate_key(event_type, "ckpt"), b"round 1", Counters(calls=3))
        # Stored under the bare id, as before debate_key: not this event type's result.
        await store.put_result("new", COMPLETED)
        yield store


def snapshot(redis_server: RedisServer, event_type: str) -> dict[bytes, bytes | None]:
    """Every key naming ``event_type`` (its streams, its debates' store keys) and its value."""
    client = redis_server.client()
    keys = sorted(client.scan_iter(match=f"*{event_type}*"))
    return {key: client.dump(key) for key in keys}


def published(redis_server: RedisServer, topic: str, after: int) -> list[dict[str, Any]]:
    """The envelopes added to ``topic`` after its first ``after`` entries."""
    entries = redis_server.client().xrange(topic)[after:]
    return [json.loads(fields[b"envelope"]) for _, fields in entries]


def actions(summary: ReplaySummary) -> dict[str | None, str]:
    return {entry.request_id: entry.action for entry in summary.entries}


async def test_a_dry_run_says_what_would_happen_and_changes_nothing(
        redis_server: RedisServer, seeded: Any, event_type: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(redis_server, event_type)
    assert len(before) > 7  # the stream and the store's keys are there to compare
    code = await asyncio.to_thread(main, ["replay", event_type, "--dry-run",
                                          "--broker", redis_server.url])
    out = capsys.readouterr().out
    assert code == 0, out
    assert snapshot(redis_server, event_type) == before
    lines = out.splitlines()
    said = {line.split("  ")[1]: line.split("  ")[2] for line in lines[:-1]}
    assert said == {
        "done": "skip: finished (completed)",
        "final": "skip: finished (failed-final)",
        "failed": "answered from the store (failed)",
        "ckpt": "run, resuming from a committed checkpoint",
        "new": "run",
        "rerun": "run afresh",
        "-": "skip: unreadable (no requestId)",
    }
    assert lines[-1] == (
        "read 7: dry run, nothing re-published: would re-publish 4, of which 1 answered from the "
        "store at no LLM cost and 3 run (1 resuming from a committed checkpoint: only what was "
        "not committed is paid); 1 run afresh (\"replay\": \"rerun\"); skipped 2 finished (a "
        "stored completed result or final failure; --reemit re-publishes them), 1 unreadable")


def last_id(redis_server: RedisServer, topic: str) -> str:
    return str(redis_server.client().xrevrange(topic, count=1)[0][0].decode())


async def test_finished_requests_are_skipped_unless_reemitted(
        redis_server: RedisServer, transport: Transport, seeded: Any, event_type: str) -> None:
    seventh = last_id(redis_server, event_type)
    summary = await replay_range(transport, event_type, store=seeded)
    again = published(redis_server, event_type, 7)
    assert [e["requestId"] for e in again] == ["failed", "ckpt", "new", "rerun"]
    assert summary.republished == 4 and summary.count("skip-finished") == 2
    assert "skipped 2 finished" in summary.line()
    assert summary.resumable is None  # looked up by dry runs only

    summary = await replay_range(transport, event_type, end=seventh, store=seeded, reemit=True)
    again = published(redis_server, event_type, 7 + 4)
    assert [e["requestId"] for e in again] == ["done", "final", "failed", "ckpt", "new", "rerun"]
    assert actions(summary)["done"] == actions(summary)["final"] == "from-store"


async def test_only_failed_or_missing_results_and_rerun(
        redis_server: RedisServer, transport: Transport, seeded: Any, event_type: str) -> None:
    seventh = last_id(redis_server, event_type)
    summary = await replay_range(transport, event_type, store=seeded, only_failed=True,
                                 rerun=True)
    again = published(redis_server, event_type, 7)
    assert [e["requestId"] for e in again] == ["failed", "ckpt", "new", "rerun"]
    assert all(e["payload"]["replay"] == "rerun" for e in again)
    assert again[0]["payload"]["input"] == "failed"  # the rest of the request as it was
    assert actions(summary) == {"done": "skip-completed", "final": "skip-finished",
                                "failed": "run", "ckpt": "run", "new": "run", "rerun": "run",
                                None: "unreadable"}
    assert "skipped 1 completed (not failed), 1 finished" in summary.line()

    # A final failure runs again (afresh) only when asked for in so many words.
    summary = await replay_range(transport, event_type, end=seventh, store=seeded,
                                 only_failed=True, rerun=True, reemit=True, dry_run=True)
    assert actions(summary)["final"] == "run" and actions(summary)["done"] == "skip-completed"


async def test_failed_needs_the_store(transport: Transport, event_type: str) -> None:
    with pytest.raises(ConfigError, match="needs the checkpoint store"):
        await replay_range(transport, event_type, only_failed=True)


async def test_without_a_store_it_says_the_store_was_not_consulted(
        redis_server: RedisServer, transport: Transport, seeded: Any, event_type: str) -> None:
    summary = await replay_range(transport, event_type, dry_run=True)
    line = summary.line()
    assert "checkpoint store not consulted: which already had results is unknown" in line
    assert "answered from the store" not in line and "finished" not in line
    assert actions(summary)["done"] == "unknown" and actions(summary)["rerun"] == "run"


async def test_an_empty_range_says_to_check_the_event_type(transport: Transport) -> None:
    summary = await replay_range(transport, f"debate:none{uuid.uuid4().hex[:6]}", dry_run=True)
    assert summary.line().startswith("nothing to replay: no entries in that range")


async def test_a_range_by_ids_and_times(redis_server: RedisServer, transport: Transport,
                                        event_type: str) -> None:
    client = BusClient(transport)
    ids = []
    for rid in ("a", "b", "c"):
        await client.publish(event_type, {"input": rid}, request_id=rid)
        ids.append(last_id(redis_server, event_type))
    summary = await replay_range(transport, event_type, start=ids[1], end=ids[1], dry_run=True)
    assert [e.request_id for e in summary.entries] == ["b"]
    ms = [int(entry_id.split("-")[0]) for entry_id in ids]
    summary = await replay_range(transport, event_type, dry_run=True,
                                 end=datetime.fromtimestamp(ms[0] / 1000, UTC))
    # A time's entries are all included (b and c too, were they published in the same ms).
    assert [e.request_id for e in summary.entries] == [
        rid for rid, at in zip("abc", ms, strict=True) if at == ms[0]]
    with pytest.raises(ConfigError, match="ends before it starts"):
        await replay_range(transport, event_type, start=ids[2], end=ids[0])
    with pytest.raises(ConfigError, match="partitions are Kafka's"):
        await replay_range(transport, event_type, partitions=[0], dry_run=True)


async def test_a_dead_letter_goes_back_to_its_origin_and_is_answered(
        redis_server: RedisServer, event_type: str) -> None:
    """A worker dead-letters a request whose handler kept failing; once it is fixed, replaying
    the DLQ puts the request back on its topic (never on the DLQ) and a worker answers it."""
    calls: list[str] = []

    async def flaky(payload: dict[str, Any]) -> dict[str, Any]:
        calls.append(payload["input"])
        if len(calls) == 1:
            raise RuntimeError("the provider is down")
        return {"answer": payload["input"].upper()}

    app = DebateBus(redis_server.url, group=f"g-{uuid.uuid4().hex[:6]}", max_deliveries=1,
                    transport_options={"claim_idle_ms": 100, "block_ms": 100})
    app.subscribe(event_type, flaky)
    dlq = dlq_topic(event_type)
    request = request_message(event_type, {"input": "hello"}, request_id="r-dead")
    async with running(app), BusClient(redis_server.url) as client, \
            store_from_url(redis_server.url) as store:
        results = await client.results(event_type)
        await client.transport.publish(dataclasses.replace(request, headers={"x-tenant": "t1"}))
        async with asyncio.timeout(30):  # handed out again once, then dead-lettered
            while not redis_server.client().xlen(dlq):  # noqa: ASYNC110 - polling Redis
                await asyncio.sleep(0.05)
        (letter,) = [d async for d in client.transport.read_range(dlq)]
        assert letter.headers[ORIGIN_HEADER] == event_type and REASON_HEADER in letter.headers

        summary = await replay_range(client.transport, dlq, store=store)
        async with asyncio.timeout(30):
            answer = await anext(aiter(results))
    assert (summary.republished, summary.dead_letters) == (1, 1)
    assert summary.entries[0].topic == event_type
    assert "1 dead letters, onto the topics they came from" in summary.line()
    assert (answer.request_id, answer.payload["answer"]) == ("r-dead", "HELLO")
    assert calls == ["hello", "hello"]
    assert redis_server.client().xlen(dlq) == 1  # nothing went back onto the DLQ
    (_, fields), = redis_server.client().xrange(event_type)[-1:]
    assert fields[b"envelope"] == request.body
    assert json.loads(fields[b"headers"]) == {"x-tenant": "t1"}  # the request's own, no more


async def test_the_cli_prints_its_summary(redis_server: RedisServer, seeded: Any, event_type: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code = await asyncio.to_thread(main, ["replay", event_type, "--failed",
                                          "--broker", redis_server.url])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.startswith("read 7: re-published 4, of which 1 answered from the store at no "
                              "LLM cost and 3 run;")
    assert "4/4 re-published" in out.err
