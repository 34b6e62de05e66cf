"""Presets: each ready panel runs end to end, directly, from the CLI and on a bus with
``payload.preset``; a preset a worker does not serve is an input error; the preset is part of
what a durable request asks."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from debatebus import Debate, Participant
from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.cli import _run_cmd as run_cmd
from debatebus.engine import PRESETS, preset
from debatebus.exceptions import ConfigError, InputError
from debatebus.handlers._inputs import request_fingerprint
from debatebus.llm import ScriptedLLM
from debatebus.schemas import events as ev
from debatebus.testing import DebateTestBus, FunctionLLM

QUESTION = "Should we move our billing service to a managed database?"


def echo_llm() -> FunctionLLM:
    """Answers every call with who is speaking and why, so texts are known in advance."""
    return FunctionLLM(lambda r: f"{r.speaker} on {r.purpose} {r.round}", model="echo")


@pytest.mark.parametrize("name", list(PRESETS))
async def test_each_preset_runs_end_to_end(name: str) -> None:
    llm = echo_llm()
    debate = Debate.from_preset(name, llm=llm)
    result = await debate.run(QUESTION)

    panel = preset(name)
    names = [p.name for p in panel.participants]
    assert result.status == "completed", result.error
    assert debate.name == name and [p.name for p in debate.participants] == names
    assert {t.speaker for r in result.rounds for t in r.turns} == set(names)
    (synthesis,) = [r for r in llm.requests if r.purpose == "synthesis"]
    assert result.synthesis == f"{synthesis.speaker} on synthesis {synthesis.round}"
    # the synthesis is asked for in the preset's structure
    structure = debate.lang.structure(panel.synthesis_sections or ())
    assert structure in synthesis.prompt


async def test_the_product_panel_weighs_every_specialists_utility() -> None:
    llm = echo_llm()
    result = await Debate.from_preset("product_decision", llm=llm).run(QUESTION)
    assert result.ok
    panel = preset("product_decision")
    assert len(panel.participants) == 5
    (synthesis,) = [r.prompt for r in llm.requests if r.purpose == "synthesis"]
    for p in panel.participants:
        assert p.utility is not None
        assert f"You maximize: {p.utility.maximizes}. You penalize: {p.utility.penalizes}." in (
            synthesis)
    assert "- Tensions:" in synthesis and "- Equilibrium:" in synthesis
    assert synthesis.index("- Tensions:") < synthesis.index("- Equilibrium:") < synthesis.index(
        "- Answer:")


async def test_the_starter_trio_with_a_scripted_model() -> None:
    script = [
        "Is a managed database worth it for billing?",  # host frames
        "Less toil.", "Vendor lock-in.", "Migrate the read path first.",  # round 1
        "Backups for free.", "Egress costs.", "Pilot for a month.",  # round 2
        "Pilot the read path for a month, then decide.",  # host's synthesis
    ]
    llm = ScriptedLLM(script)
    result = await Debate.from_preset("starter_trio", llm=llm).run(QUESTION)

    assert result.ok and llm.remaining == 0
    assert result.framing == script[0]
    assert [t.text for t in result.rounds[1].turns] == script[4:7]
    assert [t.speaker for t in result.rounds[0].turns] == ["optimist", "skeptic", "pragmatist"]
    assert result.output == script[-1]


async def test_overrides_replace_any_debate_argument() -> None:
    llm = echo_llm()
    debate = Debate.from_preset("code_review", llm=llm, name="pr-review", max_rounds=1,
                                language="es")
    assert (debate.name, debate.language) == ("pr-review", "es")
    await debate.run("def add(a, b): return a - b")
    assert all(r.system.startswith("Participas en un debate") for r in llm.requests)

    with pytest.raises(ConfigError, match=r"unknown preset 'trio'.*starter_trio"):
        Debate.from_preset("trio", llm=llm)
    with pytest.raises(ConfigError, match=r"unknown Debate arguments \['rounds'\]"):
        Debate.from_preset("starter_trio", llm=llm, rounds=2)


# ---- on a bus -----------------------------------------------------------------------------------


def house_debate(llm: FunctionLLM) -> Debate:
    return Debate("house", [Participant("a", "A"), Participant("b", "B")], llm=llm, max_rounds=1)


async def test_a_request_picks_a_preset_the_worker_serves() -> None:
    llm = echo_llm()
    handler = house_debate(llm).as_handler(presets=["starter_trio", "code_review"], durable=False)
    async with DebateTestBus(handler) as bus:
        result = await bus.request({"input": QUESTION, "preset": "code_review"})
        own = await bus.request({"input": QUESTION})

    names = [p.name for p in preset("code_review").participants]
    assert result.payload["debateStatus"] == "completed"
    assert result.payload["preset"] == "code_review"  # the request's fields are echoed
    assert result.payload["debateAgents"] == names
    (started,) = [e for e in bus.events(result.request_id) if isinstance(e, ev.DebateStarted)]
    assert (started.debate_name, started.participants) == ("code_review", names)
    assert own.payload["debateAgents"] == ["a", "b"]


@pytest.mark.parametrize(
    ("payload_preset", "reason"),
    [
        ("product_decision", "'product_decision' is not served by this worker: send one of "
                             "['starter_trio']"),
        ("no_such_panel", "'no_such_panel' is not a preset: send one of ['starter_trio']"),
        (3, "payload.preset must be a preset name (a string), got int"),
    ],
)
async def test_a_preset_the_worker_does_not_serve_is_an_input_error(
        payload_preset: Any, reason: str) -> None:
    llm = echo_llm()
    handler = house_debate(llm).as_handler(presets=["starter_trio"], durable=False)
    async with DebateTestBus(handler) as bus:
        result = await bus.request({"input": QUESTION, "preset": payload_preset})
    assert result.payload["debateStatus"] == "failed"
    assert reason in result.payload["debateError"]
    assert llm.requests == []


async def test_a_worker_without_presets_says_how_to_enable_them() -> None:
    llm = echo_llm()
    async with DebateTestBus(house_debate(llm).as_handler(durable=False)) as bus:
        result = await bus.request({"input": QUESTION, "preset": "starter_trio"})
    assert "this worker serves none (enable them with as_handler(presets=[...]))" in (
        result.payload["debateError"])


async def test_a_stored_result_is_reused_only_for_the_same_preset() -> None:
    llm = echo_llm()
    handler = house_debate(llm).as_handler(presets=["starter_trio"],
                                           store=MemoryCheckpointStore())
    asked = {"input": QUESTION, "preset": "starter_trio", "debateId": "d-1"}
    first = await handler(asked)
    calls = len(llm.requests)
    again = await handler(asked)
    assert first["debateStatus"] == "completed" and calls == 8
    assert again["debateReplayed"] is True and len(llm.requests) == calls  # zero calls
    assert again["debateOutput"] == first["debateOutput"]

    with pytest.raises(InputError, match=r"\(payload.input, maxRounds or preset differ\)"):
        await handler({"input": QUESTION, "debateId": "d-1"})  # same id, no preset
    with pytest.raises(InputError, match=r"already used"):
        await handler({**asked, "preset": None})
    assert len(llm.requests) == calls


def test_requests_without_a_preset_keep_their_fingerprint() -> None:
    # The fingerprint as it was computed before presets existed.
    before = hashlib.sha256(b'{"v":1,"input":"q","maxRounds":2}').hexdigest()[:32]
    assert request_fingerprint("q", 2) == before
    assert request_fingerprint("q", 2, None) == before
    assert request_fingerprint("q", 2, "starter_trio") != before
    assert request_fingerprint("q", 2, "starter_trio") != request_fingerprint("q", 2, "code_review")


def test_handler_presets_are_checked_at_construction() -> None:
    llm = echo_llm()
    with pytest.raises(ConfigError, match=r"unknown preset 'trio'"):
        house_debate(llm).as_handler(presets=["trio"])
    with pytest.raises(ConfigError, match=r"presets= takes preset names"):
        house_debate(llm).as_handler(presets="starter_trio")
    no_default = Debate("own", [Participant("a", "A", llm=llm), Participant("b", "B", llm=llm)])
    with pytest.raises(ConfigError, match=r"has none: pass llm=… to its Debate"):
        no_default.as_handler(presets=["starter_trio"])


# ---- the CLI ------------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run_cmd.add_parser(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_cli_preset_and_language_parse() -> None:
    args = parse("t", "--preset", "code_review", "--language", "es")
    assert (args.preset, args.language) == ("code_review", "es")
    assert (parse("t").preset, parse("t").language) == (None, "en")
    with pytest.raises(SystemExit):
        parse("t", "--preset", "no_such_panel")


async def test_cli_runs_a_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = ["framing", "o1", "s1", "p1", "The trio's synthesis."]
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    args = parse(QUESTION, "--preset", "starter_trio", "--rounds", "1", "--llm", f"scripted:{path}")
    assert await run_cmd.run(args) == 0
    out = capsys.readouterr().out
    for text in ["optimist (round 1", "skeptic (round 1", "pragmatist (round 1",
                 "The trio's synthesis.", "over 5 calls"]:
        assert text in out


async def test_cli_json_with_a_preset_in_spanish(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = ["encuadre", "o1", "s1", "p1", "Síntesis del trío."]
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    args = parse(QUESTION, "--preset", "starter_trio", "--rounds", "1", "--language", "es",
                 "--json", "--llm", f"scripted:{path}")
    assert await run_cmd.run(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["debateOutput"] == "Síntesis del trío."
    assert document["debateAgents"] == ["optimist", "skeptic", "pragmatist"]


async def test_cli_prices_a_debate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--prices FILE: the outcome says what the calls cost (the scripted model's words are its
    tokens: 5 calls of known length)."""
    script = ["framing", "o1", "s1", "p1", "The trio's synthesis."]
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    prices = tmp_path / "prices.toml"
    prices.write_text('[models."scripted:script.json"]\ninput = 1.0\ncached_input = 0.1\n'
                      "cache_write = 1.25\noutput = 2.0\n")
    args = parse(QUESTION, "--preset", "starter_trio", "--rounds", "1", "--json",
                 "--prices", str(prices), "--llm", f"scripted:{path}")
    assert await run_cmd.run(args) == 0
    document = json.loads(capsys.readouterr().out)
    usage, cost = document["debateTokenUsage"], document["debateCost"]
    assert cost["currency"] == "USD"
    expected = (usage["promptTokens"] * 1.0 + usage["completionTokens"] * 2.0) / 1e6
    assert cost["total"] == pytest.approx(expected, abs=1e-9)
    assert set(cost["participants"]) == {"host", "optimist", "skeptic", "pragmatist"}

