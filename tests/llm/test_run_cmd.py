"""``debatebus run``: the terminal debate, with a scripted model so the output is known."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest

from debatebus._demo import build_debate
from debatebus.cli import _run_cmd as run_cmd
from debatebus.cli._run_cmd import DebateView, RichScreen
from debatebus.llm import ScriptedLLM
from debatebus.schemas import events as ev

JUDGED = [
    "Let us weigh cost against speed.",  # moderator framing
    "Ship faster.",
    "Too complex.",
    "Start modular.",
    {"consensus": False, "summary": "still apart"},
    "Teams scale.",
    "Ops cost.",
    "Extract later.",
    {"consensus": True, "summary": "modular first", "winner": "pragmatist"},
    "Start with a modular monolith.",  # moderator synthesis
]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run_cmd.add_parser(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def script(tmp_path: Path, entries: list[Any]) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(entries))
    return f"scripted:{path}"


def test_arguments_and_defaults() -> None:
    args = parse("Should we?")
    assert (args.question, args.llm, args.protocol, args.rounds, args.judge, args.json) == (
        "Should we?",
        None,
        "round-robin",
        2,
        False,
        False,
    )
    assert args.func is run_cmd.run
    args = parse(
        "t",
        "--llm",
        "local",
        "--protocol",
        "cross-pollination",
        "--rounds",
        "3",
        "--judge",
        "--json",
    )
    assert (args.llm, args.protocol, args.rounds, args.judge, args.json) == (
        "local",
        "cross-pollination",
        3,
        True,
        True,
    )


@pytest.mark.parametrize("bad", ["0", "-1", "two"])
def test_rounds_must_be_positive(bad: str) -> None:
    with pytest.raises(SystemExit):
        parse("t", "--rounds", bad)


async def test_plain_output_shows_turns_verdict_and_outcome(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = await run_cmd.run(parse("Microservices?", "--llm", script(tmp_path, JUDGED), "--judge"))
    out = capsys.readouterr().out
    assert code == 0
    for text in [
        "Debate: Microservices?",
        "optimist (round 1",
        "Too complex.",
        "Extract later.",
        "== Synthesis ==",
        "Start with a modular monolith.",
        "consensus: True",
        "winner: pragmatist",
        "stopped by the judge",
        "Φ̂: ",
        "over 10 calls",
    ]:
        assert text in out
    assert out.index("Ship faster.") < out.index("Too complex.") < out.index("Teams scale.")


async def test_turns_are_printed_as_they_are_written_and_as_the_transcript_keeps_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = list(JUDGED)
    entries[2] = "critic: Too complex.\noptimist: Not at all."  # cleaning keeps "Too complex."
    code = await run_cmd.run(parse("Microservices?", "--llm", script(tmp_path, entries), "--judge"))
    out = capsys.readouterr().out
    assert code == 0
    written = out[out.index("critic (round 1):"):]
    # The raw pieces as they came, then the turn's figures, then what the transcript kept.
    assert written.startswith("critic (round 1):\ncritic: Too complex.\noptimist: Not at all.\n")
    assert "(round 1 · " in written
    assert "kept as: Too complex." in written
    assert out.count("Start with a modular monolith.") == 1  # typed, not printed again after


async def test_no_stream_prints_each_turn_once_it_is_finished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse("Microservices?", "--llm", script(tmp_path, JUDGED), "--judge", "--no-stream")
    assert await run_cmd.run(args) == 0
    out = capsys.readouterr().out
    assert "optimist (round 1 · " in out  # the figures head the turn: it came whole
    assert "kept as" not in out


async def test_json_output_is_the_result_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse("Microservices?", "--llm", script(tmp_path, JUDGED), "--judge", "--json")
    assert await run_cmd.run(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["debateStatus"] == "completed"
    assert document["debateRounds"] == 2
    assert document["debateSynthesis"] == "Start with a modular monolith."
    assert document["debateVerdict"]["winner"] == "pragmatist"
    assert document["debateTokenUsage"]["totalTokens"] > 0


async def test_failed_debate_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("t", "--llm", script(tmp_path, ["framing only"]), "--rounds", "1")
    assert await run_cmd.run(args) == 1
    assert "status: failed" in capsys.readouterr().out


def test_bad_model_string_is_reported_by_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from debatebus.cli import main

    assert main(["run", "t", "--llm", "nonsense:x"]) == 2
    assert "accepted forms" in capsys.readouterr().err


class RecordingScreen:
    def __init__(self) -> None:
        self.statuses: list[str] = []
        self.lines: list[str] = []

    def heading(self, text: str) -> None:
        self.lines.append(text)

    def speech(self, speaker: str, colour: str, meta: str, text: str,
               typed: str | None = None) -> None:
        self.lines.append(f"{speaker}|{colour}|{text}")

    def typing(self, speaker: str, colour: str, what: str) -> None:
        self.lines.append(f"typing {speaker} {what}")

    def more(self, piece: str) -> None:
        self.lines.append(f"+{piece}")

    def typed(self) -> None:
        self.lines.append("typed")

    def note(self, text: str) -> None:
        self.lines.append(text)

    def status(self, text: str) -> None:
        self.statuses.append(text)

    def close(self) -> None:
        pass


async def test_spinner_says_who_is_working() -> None:
    screen = RecordingScreen()
    debate = build_debate(ScriptedLLM(JUDGED), judge=True, rounds=2)
    view = DebateView(debate, screen)
    await debate.run("t", on_event=view.on_event)
    assert screen.statuses[:6] == [
        "moderator is framing the topic…",
        "optimist is thinking…",  # framing done
        "optimist is thinking…",  # round 1 started
        "critic is thinking…",
        "pragmatist is thinking…",
        "the judge is deliberating…",
    ]
    assert screen.statuses[-1] == "moderator is writing the synthesis…"
    colours = {line.split("|")[0]: line.split("|")[1] for line in screen.lines if "|" in line}
    assert len({colours["optimist"], colours["critic"], colours["pragmatist"]}) == 3


def test_cross_pollination_spinner_lists_everyone_pending() -> None:
    screen = RecordingScreen()
    debate = build_debate(ScriptedLLM([]), protocol="cross-pollination", rounds=1)
    view = DebateView(debate, screen)
    view.on_event(ev.RoundStarted(debate_id="d", seq=1, round=1, phase="position"))
    view.on_event(ev.TurnCompleted(debate_id="d", seq=2, speaker="critic", round=1, text="x"))
    assert screen.statuses == [
        "optimist, critic, pragmatist thinking…",
        "optimist, pragmatist thinking…",
    ]


def test_rich_screen_prints_model_text_verbatim() -> None:
    out = io.StringIO()
    screen = RichScreen(out)
    screen.speech("critic", "magenta", "round 1", "[bold]not markup[/bold] and [link]")
    screen.close()
    assert "[bold]not markup[/bold] and [link]" in out.getvalue()
