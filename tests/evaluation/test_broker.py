"""``--broker``: each item published to a real fleet (a worker process on a private Redis) gives
the same table as the same debate run in process, with scripted models."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.evaluation.world import DATASET, world_debate, world_llm
from tests.support.servers import RedisServer

from debatebus.cli import main
from debatebus.client import BusClient
from debatebus.evaluation import DebateArm, Evaluation, FleetArm, Report, Single, Vote
from debatebus.observability._heartbeat import latest_heartbeat

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
LATENCY = ("latency_p50_s", "latency_p95_s")


@dataclass
class Fleet:
    url: str
    event_type: str


@pytest.fixture
def fleet(redis_server: RedisServer, tmp_path: Path) -> Iterator[Fleet]:
    """A worker process serving the world's debate, once it beats."""
    event_type, group = f"eval:{uuid.uuid4().hex[:8]}", f"eval-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DBB_BROKER": redis_server.url, "DBB_EVENT_TYPE": event_type,
           "DBB_GROUP": group, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "debatebus", "worker",
                                 "tests.evaluation.fleet_app:app"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    async def beating() -> None:
        async with asyncio.timeout(20):
            while await latest_heartbeat(redis_server.url, group) is None:
                assert proc.poll() is None, log.read_text()
                await asyncio.sleep(0.05)

    try:
        asyncio.run(beating())
        yield Fleet(redis_server.url, event_type)
    finally:
        proc.terminate()
        proc.wait(20)


def table(report: Report) -> list[tuple[str, ...]]:
    """The table as shown, without its latency columns."""
    return [row[:-3] + row[-1:] for row in report.rows()]


def test_the_fleet_gives_the_table_the_debate_gives_in_process(fleet: Fleet) -> None:
    async def evaluate(debate: Any) -> Report:
        llm = world_llm()
        arms = [Single(llm), Vote(llm, matched_to="debate"), debate]
        return await Evaluation(DATASET, arms).run()

    async def over_the_bus() -> Report:
        async with BusClient(fleet.url) as client:
            return await evaluate(FleetArm(client, event_type=fleet.event_type, name="debate",
                                           final="majority"))

    served = asyncio.run(over_the_bus())
    in_process = asyncio.run(evaluate(DebateArm(world_debate(), name="debate", final="majority")))
    assert table(served) == table(in_process)
    # Not a table of nothing: the worked-out figures (tests/evaluation/world.py).
    assert [arm.correct for arm in served.arms] == [3, 8, 10]
    assert served.arm("vote").calls == served.arm("debate").calls == 6
    assert served.arm("debate").kind == "fleet"


def test_debatebus_eval_with_broker_gives_the_in_process_row(
        fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["eval", "--items", "10", "--seed", "3", "--json"]  # no arm needs --llm
    served = ["--broker", fleet.url, "--arm", f"fleet:{fleet.event_type}",
              "--out", str(tmp_path / "served")]
    assert main([*common, *served]) == 0
    over_the_bus = json.loads(capsys.readouterr().out)
    in_process = ["--arm", "debate:tests.evaluation.world:DEBATE", "--out", str(tmp_path / "here")]
    assert main([*common, *in_process]) == 0
    here = json.loads(capsys.readouterr().out)
    rows = [{k: v for k, v in doc["arms"][0].items() if k not in (*LATENCY, "name", "kind")}
            for doc in (over_the_bus, here)]
    assert rows[0] == rows[1]
    assert rows[0]["correct"] == 10 and rows[0]["calls"] == 6  # the last turn is right
    assert over_the_bus["config"]["models"] == {"broker": fleet.url}
    assert here["config"]["models"] == {}
