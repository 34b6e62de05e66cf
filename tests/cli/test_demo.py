"""``debatebus demo``: the demo debate served on a bus, each turn printed as it finishes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from tests.support.bus import make_debate, running

from debatebus._demo import DEMO_EVENT_TYPE, DEMO_GROUP
from debatebus._worker import DebateBus
from debatebus.cli import main
from debatebus.client import BusClient
from debatebus.llm import LLMRequest
from debatebus.schemas.envelope import completed_topic
from debatebus.testing import FunctionLLM

SCRIPT = [
    "FRAMING: weigh cost against speed.",  # moderator framing
    "OPTIMIST-1: ship faster.",
    "CRITIC-1: too complex.",
    "PRAGMATIST-1: start modular.",
    {"consensus": False, "summary": "VERDICT-1 still apart"},
    "OPTIMIST-2: teams scale.",
    "CRITIC-2: ops cost.",
    "PRAGMATIST-2: extract later.",
    {"consensus": True, "summary": "VERDICT-2 modular first", "winner": "pragmatist"},
    "SYNTHESIS: start with a modular monolith.",  # moderator synthesis
]


def test_demo_prints_turns_in_order_then_the_result(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    code = main(["demo", "--broker", "memory://", "--llm", f"scripted:{script}",
                 "Should we adopt microservices?"])
    out = capsys.readouterr().out
    assert code == 0, out
    shown = ["Debate: Should we adopt microservices?", "FRAMING:", "Round 1", "OPTIMIST-1",
             "CRITIC-1", "PRAGMATIST-1", "VERDICT-1", "Round 2", "OPTIMIST-2", "CRITIC-2",
             "PRAGMATIST-2", "VERDICT-2"]
    positions = [out.find(text) for text in shown]
    assert -1 not in positions, list(zip(shown, positions, strict=True))
    assert positions == sorted(positions)
    # The result document comes last, once, after every turn.
    result_at = out.index("{\n")
    assert result_at > positions[-1]
    result = json.loads(out[result_at:])
    assert result["debateStatus"] == "completed"
    assert result["debateRounds"] == 2
    assert "SYNTHESIS: start with a modular monolith." in result["debateOutput"]
    assert out.count("OPTIMIST-1") == 1  # each turn is printed once


@pytest.mark.redis
async def test_demo_beside_a_real_worker_on_one_redis_neither_touches_the_others_traffic(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_server: Any) -> None:
    """``DEBATEBUS_BROKER`` is honoured, and the demo asks and answers on its own event type and
    group: a real worker serving ``debate:request`` on the same Redis answers its own request and
    sees nothing of the demo's, and the demo answers only its own."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    monkeypatch.setenv("DEBATEBUS_BROKER", redis_server.url)
    questions: list[str] = []

    def real_llm(request: LLMRequest) -> Any:
        questions.append(request.prompt.split("\n", 1)[0])
        return {"consensus": True, "summary": "ok"} if request.purpose == "judge" else "a turn"

    worker = DebateBus(redis_server.url, heartbeat_interval_s=None)
    worker.subscribe("debate:request", make_debate(FunctionLLM(real_llm)).as_handler())
    async with running(worker), BusClient(redis_server.url) as client:
        code = await asyncio.to_thread(main, ["demo", "--llm", f"scripted:{script}", "Demo?"])
        real = await client.request("debate:request", {"input": "Real traffic?"},
                                    request_id="real-1", timeout=30)
    assert code == 0
    assert real.payload["debateStatus"] == "completed"
    # The real worker ran only the real question; the demo's script (one debate's worth) was
    # used by the demo alone, or the demo would have failed.
    assert questions and all("Real traffic?" in q for q in questions)
    redis = Redis.from_url(redis_server.url)
    try:
        assert await redis.xlen("debate:request") == 1
        assert await redis.xlen(completed_topic("debate:request")) == 1
        assert await redis.xlen(completed_topic(DEMO_EVENT_TYPE)) == 1
        assert {g["name"] for g in await redis.xinfo_groups(DEMO_EVENT_TYPE)} == {
            DEMO_GROUP.encode()}
        assert {g["name"] for g in await redis.xinfo_groups("debate:request")} == {b"debatebus"}
    finally:
        await redis.aclose()
