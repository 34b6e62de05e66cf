"""``debatebus eval`` on scripted models: the table, the files, resuming, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from debatebus.cli import main


def scripted(tmp_path: Path, answers: list[str]) -> str:
    path = tmp_path / "model.json"
    path.write_text(json.dumps(answers))
    return f"scripted:{path}"


def test_an_evaluation_prints_its_table_writes_its_files_and_resumes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "eval"
    # Per item: the single call, the round-robin's 2 solvers × 2 rounds, 4 matched samples.
    model = scripted(tmp_path, ["So the answer is 5."] * 9 * 3)
    args = ["eval", "--items", "3", "--llm", model, "--out", str(out),
            "--arm", "single", "--arm", "round-robin:2x2", "--arm", "vote"]
    assert main(args) == 0
    shown = capsys.readouterr()
    lines = shown.out.splitlines()
    assert lines[0].split()[:2] == ["arm", "accuracy"]
    assert [line.split()[0] for line in lines[2:5]] == ["single", "round-robin:2x2", "vote"]
    assert "9/9" in shown.err and "written:" in shown.err
    assert sorted(p.name for p in out.iterdir()) == [
        "accuracy-tokens.svg", "items.jsonl", "report.json", "report.md"]
    report = json.loads((out / "report.json").read_text())
    calls = {arm["name"]: arm["calls"] for arm in report["arms"]}
    assert calls == {"single": 1, "round-robin:2x2": 4, "vote": 4}  # the vote matched the debate
    assert report["config"]["models"] == {"llm": model}
    assert report["config"]["dataset"]["source"] == "arithmetic(n=3, seed=0)"

    # Again: every result is read back (the script would be asked from its first answer).
    assert main(args) == 0
    again = capsys.readouterr()
    assert again.err.count("(stored)") == 9
    assert again.out.splitlines()[2].split()[:3] == lines[2].split()[:3]
    assert main([*args, "--fresh"]) == 0  # started over: every item asked again
    assert "(stored)" not in capsys.readouterr().err


def test_a_jsonl_dataset_with_its_own_fields(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "capitals.jsonl"
    data.write_text('{"q": "Capital of France?", "gold": "Paris"}\n'
                    '{"q": "Capital of Spain?", "gold": "Madrid"}\n')
    model = scripted(tmp_path, ["paris", "Lisbon"])
    assert main(["eval", "--dataset", f"jsonl:{data}", "--question-field", "q",
                 "--reference-field", "gold", "--grader", "exact", "--arm", "single",
                 "--llm", model, "--out", str(tmp_path / "eval"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["arms"][0]["correct"], report["arms"][0]["items"]) == (1, 2)
    assert report["config"]["grader"] == {"grader": "exact"}


@pytest.mark.parametrize(("args", "message"), [
    (["--arm", "bogus"], "--arm 'bogus': use single, vote"),
    (["--arm", "fleet"], "--arm 'fleet' publishes to a running fleet: pass --broker URL"),
    (["--arm", "single", "--arm", "vote"], "matched to the first debate arm's calls, and there "
                                           "is none"),
    (["--arm", "vote:often"], "use vote, vote:tokens or vote:K"),
    (["--arm", "single", "--arm", "single"], "--arm 'single' is given twice"),
    (["--arm", "preset:nobody"], "no preset 'nobody'; use one of"),
    (["--arm", "cross-pollination:3x3"], "cross-pollination always plays 2 rounds"),
    (["--arm", "debate:tests.evaluation.world:DATASET"], "is a Dataset, not a Debate"),
    (["--dataset", "gsm8k"], "--dataset 'gsm8k': use arithmetic, gsm8k:PATH or jsonl:PATH"),
    (["--grader", "fuzzy"], "--grader 'fuzzy': use numeric, exact, regex:PATTERN or judge"),
])
def test_bad_arguments_say_what_to_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       args: list[str], message: str) -> None:
    model = scripted(tmp_path, [])
    code = main(["eval", "--items", "2", "--llm", model, "--out", str(tmp_path), *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "items.jsonl").exists()
