"""Datasets: Du et al.'s seeded arithmetic, GSM8K's JSONL, any JSONL; samples drawn with a seed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from debatebus.evaluation import arithmetic, gsm8k, jsonl
from debatebus.evaluation._datasets import ARITHMETIC_INSTRUCTION
from debatebus.exceptions import ConfigError

GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k" / "test.jsonl"
FORMAT = re.compile(r"^What is the result of (\d+)\+(\d+)\*(\d+)\+(\d+)-(\d+)\*(\d+)\?$")


def test_arithmetic_is_du_et_al_format_with_the_right_references() -> None:
    dataset = arithmetic(200, seed=11)
    assert len(dataset.items) == 200
    values: set[int] = set()
    for item in dataset.items:
        found = FORMAT.match(item.question)
        assert found is not None, item.question
        a, b, c, d, e, f = (int(x) for x in found.groups())
        assert all(0 <= x <= 29 for x in (a, b, c, d, e, f))
        assert item.reference == str(a + b * c + d - e * f)
        values.update((a, b, c, d, e, f))
    assert values == set(range(30))  # the whole range is drawn
    assert dataset.prompt(dataset.items[0]) == (
        f"{dataset.items[0].question} {ARITHMETIC_INSTRUCTION}")


def test_arithmetic_is_deterministic_per_seed() -> None:
    assert arithmetic(50, seed=3) == arithmetic(50, seed=3)
    assert arithmetic(50, seed=3).items != arithmetic(50, seed=4).items
    assert arithmetic(10, seed=3).items == arithmetic(50, seed=3).items[:10]  # drawn in order
    assert len({item.id for item in arithmetic(50, seed=3).items}) == 50


def test_jsonl_with_named_fields_and_seeded_samples(tmp_path: Path) -> None:
    path = tmp_path / "capitals.jsonl"
    rows = [{"q": f"Capital number {i}?", "gold": i * 10, "extra": True} for i in range(20)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    dataset = jsonl(path, question="q", reference="gold", instruction="Answer briefly.")
    assert [(i.question, i.reference) for i in dataset.items[:2]] == [
        ("Capital number 0?", "0"), ("Capital number 1?", "10")]
    assert dataset.prompt(dataset.items[1]) == "Capital number 1? Answer briefly."
    drawn = dataset.sample(5, seed=1)
    assert drawn == dataset.sample(5, seed=1)
    assert drawn.items != dataset.sample(5, seed=2).items
    assert [i.id for i in drawn.items] == sorted((i.id for i in drawn.items),
                                                 key=lambda x: int(x.rsplit("-", 1)[1]))
    assert drawn.source == "jsonl:capitals.jsonl, 5 drawn with seed 1"
    assert dataset.sample(3).items == dataset.items[:3]
    assert dataset.sample(100) is dataset


@pytest.mark.parametrize(("text", "message"), [
    ('{"question": "Q?"}\n', r"capitals.jsonl:1 has no text or number field 'answer' \(its "
                             r"fields: question\)"),
    ('{"question": "Q?", "answer": "1"}\nnot json\n', "capitals.jsonl:2 is not JSON"),
    ('["Q?", "1"]\n', "capitals.jsonl:1 must be a JSON object, got list"),
    ("\n", "holds no items"),
])
def test_bad_files_say_what_to_fix(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "capitals.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        jsonl(path)


def test_gsm8k_answers_must_end_with_the_hashes(tmp_path: Path) -> None:
    path = tmp_path / "maths.jsonl"
    path.write_text(json.dumps({"question": "1+1?", "answer": "It is 2."}) + "\n")
    with pytest.raises(ConfigError, match=r"does not end with '#### <number>'.*jsonl\(\)"):
        gsm8k(path)
    with pytest.raises(ConfigError, match="cannot read the dataset"):
        gsm8k(tmp_path / "absent.jsonl")


@pytest.mark.skipif(not GSM8K.is_file(), reason=f"GSM8K's test split is not at {GSM8K}")
def test_the_gsm8k_test_split_reads_with_its_references() -> None:
    dataset = gsm8k(GSM8K)
    assert len(dataset.items) == 1319
    first = dataset.items[0]
    assert first.question.startswith("Janet’s ducks lay 16 eggs per day.")
    assert first.reference == "18"
    assert any("," in item.reference for item in dataset.items)  # "#### 2,125": the grader's job
    assert dataset.sample(50, seed=0) == dataset.sample(50, seed=0)
