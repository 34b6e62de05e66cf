"""``debatebus fork``: a stored debate forked from round 2 with another model for the critic,
from the command line: no call for rounds 1-2, the critic's later turns on its new model, the
parent's result unchanged; and what it says when it cannot fork."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tests.cli import fork_app

from debatebus.checkpoints import SQLiteCheckpointStore
from debatebus.cli import main
from debatebus.handlers._checkpointing import debate_key
from debatebus.handlers._contract import HandlerContext
from debatebus.transports import Delivery

KEY = debate_key("debate:request", "p1")


async def stored_parent(path: Path) -> bytes:
    """Debate p1 run and stored, as a worker serving debate:request would."""
    async with SQLiteCheckpointStore(str(path)) as store:
        handler = fork_app.debate.as_handler(store=store)
        ctx = HandlerContext("p1", None, Delivery("debate:request", b"", "1-0"))
        await handler.handle({"input": "Rewrite billing in Rust?"}, ctx)
        stored = await store.get_result(KEY)
    assert stored is not None
    return stored


async def result_of(path: Path) -> bytes | None:
    async with SQLiteCheckpointStore(str(path)) as store:
        return await store.get_result(KEY)


def test_fork_from_round_2_with_another_model_for_the_critic(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, script = tmp_path / "debates.db", tmp_path / "critic.json"
    script.write_text(json.dumps(["critic, scripted, round 3", "critic, scripted, round 4"]))
    parent = asyncio.run(stored_parent(db))
    fork_app.CALLS.clear()

    code = main(["fork", "p1", "--from-round", "2", "--app", "tests.cli.fork_app:app",
                 "--store", f"sqlite:///{db}", "--model", f"critic=scripted:{script}",
                 "--id", "f1", "--json"])

    assert code == 0
    fields = json.loads(capsys.readouterr().out)
    assert fields["debateForkOf"] == {"debateId": "p1", "fromRound": 2}
    critic = [t["text"] for r in fields["debateTranscript"] for t in r["turns"]
              if t["speaker"] == "critic"]
    assert critic == ["critic in round 1", "critic in round 2", "critic, scripted, round 3",
                      "critic, scripted, round 4"]
    assert {r for (_, r, _) in fork_app.CALLS} == {3, 4}  # none for rounds 1-2
    assert ("rebuttal", 3, "critic") not in fork_app.CALLS  # the critic is on its new model
    assert asyncio.run(result_of(db)) == parent  # the parent's result unchanged

    assert main(["fork", "p1", "--from-round", "2", "--app", "tests.cli.fork_app:app",
                 "--store", f"sqlite:///{db}", "--id", "f1"]) == 0  # replayed, as a summary
    summary = capsys.readouterr().out
    assert summary.startswith("fork f1 of p1 from round 2: completed, 4 rounds\n")
    assert "  round 3 critic: critic, scripted, round 3\n" in summary


def test_fork_says_what_it_cannot_fork(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "debates.db"
    asyncio.run(stored_parent(db))
    base = ["fork", "p1", "--app", "tests.cli.fork_app:app", "--store", f"sqlite:///{db}"]
    assert main([*base, "--from-round", "9"]) == 2
    assert "committed rounds [1, 2, 3, 4]" in capsys.readouterr().err
    assert main([*base, "--from-round", "1", "--type", "debate:other"]) == 2
    assert "serves no debate on 'debate:other'" in capsys.readouterr().err
    assert main([*base, "--from-round", "1", "--model", "critic"]) == 2
    assert "--model takes NAME=MODEL" in capsys.readouterr().err
