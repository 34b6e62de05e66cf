"""What a new user met on day one (issue 14): the replay summary, ``run``'s rounds and outcome,
``check`` after a clean stop, and ``schemaVersion`` as the wire format describes it."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.support.processes import start_worker
from tests.support.servers import free_port

from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.cli import main
from debatebus.cli._observe_cmds import check
from debatebus.cli._ops_cmds import replay_range
from debatebus.handlers._checkpointing import debate_key
from debatebus.schemas.envelope import ENVELOPE_ENCODER, Envelope, decode_request
from debatebus.transports import MemoryTransport, Outgoing
from debatebus.transports._memory import MemoryBroker


def _request(request_id: str, **payload: str) -> bytes:
    return json.dumps({"requestId": request_id, "payload": {"input": "t", **payload}}).encode()


async def test_replay_summary_counts_reruns_apart_from_stored_results() -> None:
    store = MemoryCheckpointStore()
    await store.put_result(debate_key("debate:request", "done"), b"{}")
    # Stored, but the request asks to run it afresh.
    await store.put_result(debate_key("debate:request", "again"), b"{}")
    async with MemoryTransport(MemoryBroker()) as transport:
        for body in (_request("done"), _request("again", replay="rerun"), _request("new"),
                     b"not json"):
            await transport.publish(Outgoing("debate:request", body))
        summary = await replay_range(transport, "debate:request", store=store)
    assert (summary.read, summary.republished, summary.count("skip-finished"), summary.fresh,
            summary.count("unreadable")) == (4, 2, 1, 1, 1)
    assert summary.line() == (
        "read 4: re-published 2, of which 0 answered from the store at no LLM cost and 2 run; "
        '1 run afresh ("replay": "rerun"); skipped 1 finished (a stored completed result or '
        "final failure; --reemit re-publishes them), 1 unreadable")


def _script(tmp_path: Path, entries: int) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps([f"answer {i}" for i in range(entries)]))
    return f"scripted:{path}"


def test_cross_pollination_refuses_a_round_count_it_would_not_play(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "t", "--protocol", "cross-pollination", "--rounds", "3",
                 "--llm", _script(tmp_path, 8)])
    assert code == 2
    assert "cross-pollination always plays 2 rounds" in capsys.readouterr().err


def test_cross_pollination_without_a_judge_is_not_stopped_by_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The demo panel: moderator framing, 3 positions, 3 revisions, the moderator's synthesis.
    code = main(["run", "t", "--protocol", "cross-pollination", "--llm", _script(tmp_path, 8)])
    out = capsys.readouterr().out
    assert code == 0, out
    status = next(line for line in out.splitlines() if line.startswith("status:"))
    assert "judge" not in status
    assert "stopped by the protocol" in status and "2 rounds" in status


@pytest.mark.redis
async def test_check_is_unhealthy_within_2_s_of_a_sigterm(redis_server: Any, tmp_path: Path) -> None:
    url, group = redis_server.url, f"g-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "worker.log"
    proc = start_worker(url, f"debate:request{uuid.uuid4().hex[:8]}", group, free_port(), log)
    try:
        async with asyncio.timeout(60):
            while (await check(url, group, max_age=300))[0] != 0:
                assert proc.poll() is None, log.read_text()
                await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        # --max-age 300: only the worker's last beat can make the check fail this soon.
        while (await check(url, group, max_age=300))[0] == 0:
            assert time.monotonic() - signalled < 2.0, "check still ok 2 s after a SIGTERM"
            await asyncio.sleep(0.05)
        assert proc.wait(60) == 0, log.read_text()  # and it drained and exited cleanly
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_schema_version_is_read_as_1_and_not_written_as_the_wire_format_says() -> None:
    body = ENVELOPE_ENCODER.encode(Envelope("r-1", {"input": "t"}))
    assert b"schemaVersion" not in body
    assert decode_request(body).schema_version == 1
    wire_format = (Path(__file__).resolve().parents[2] / "docs" / "wire-format.md").read_text()
    assert "`schemaVersion` is not on the wire while it is 1" in wire_format
