"""What an evaluation asks: items with a question and a reference answer.

- ``arithmetic``: Du et al.'s seeded arithmetic, ``What is the result of a+b*c+d-e*f?`` (0–29).
- ``gsm8k``: GSM8K-style JSONL (``question``; ``answer`` ending ``#### <number>``).
- ``jsonl``: any JSONL with a question field and a reference field, named as you like.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from debatebus.exceptions import ConfigError

#: Du et al.'s instruction for the arithmetic task, asked after every question.
ARITHMETIC_INSTRUCTION = "Make sure to state your answer at the end of the response."
#: The instruction after a GSM8K question: reason, then end on the number.
GSM8K_INSTRUCTION = ("Explain your reasoning. Your final answer should be a single number, at the "
                     "end of your response.")


@dataclass(frozen=True, slots=True)
class Item:
    """One question and the answer it should get. ``id`` is stable across runs: results are
    stored and resumed by it."""

    id: str
    question: str
    reference: str


@dataclass(frozen=True, slots=True)
class Dataset:
    """Items and how every arm is asked them: ``prompt(item)`` is the question, then
    ``instruction``. ``source`` says where the items came from (the report records it)."""

    name: str
    items: tuple[Item, ...]
    source: str
    instruction: str = ""

    def prompt(self, item: Item) -> str:
        return f"{item.question} {self.instruction}" if self.instruction else item.question

    def sample(self, n: int, seed: int | None = None) -> Dataset:
        """``n`` of the items: the first ``n``, or (with ``seed``) ``n`` drawn at random with
        that seed, kept in file order."""
        if n < 1:
            raise ConfigError(f"a sample needs at least 1 item, got {n}")
        if n >= len(self.items):
            return self
        if seed is None:
            return replace(self, items=self.items[:n], source=f"{self.source}, first {n}")
        chosen = sorted(random.Random(seed).sample(range(len(self.items)), n))
        return replace(self, items=tuple(self.items[i] for i in chosen),
                       source=f"{self.source}, {n} drawn with seed {seed}")


def arithmetic(n: int = 50, *, seed: int = 0) -> Dataset:
    """``n`` items in Du et al.'s format, ``What is the result of a+b*c+d-e*f?`` with a..f drawn
    from 0–29 by a generator seeded with ``seed``: the same seed, the same items."""
    if n < 1:
        raise ConfigError(f"arithmetic needs n ≥ 1 items, got {n}")
    draw = random.Random(seed)
    items = []
    for i in range(n):
        a, b, c, d, e, f = (draw.randint(0, 29) for _ in range(6))
        items.append(Item(f"arithmetic-{seed}-{i}", f"What is the result of {a}+{b}*{c}+{d}-{e}*{f}?",
                          str(a + b * c + d - e * f)))
    return Dataset("arithmetic", tuple(items), f"arithmetic(n={n}, seed={seed})",
                   ARITHMETIC_INSTRUCTION)


def gsm8k(path: str | Path) -> Dataset:
    """GSM8K-style JSONL: ``question``, and ``answer`` whose reference is the number after its
    last ``####``."""
    return _read(Path(path), "gsm8k", "question", "answer", _after_hashes, GSM8K_INSTRUCTION)


def jsonl(path: str | Path, *, question: str = "question", reference: str = "answer",
          instruction: str = "") -> Dataset:
    """Any JSONL whose lines hold the fields ``question`` and ``reference`` (a string or a
    number, compared as the grader says)."""
    return _read(Path(path), "jsonl", question, reference, lambda text, where: text, instruction)


def _after_hashes(answer: str, where: str) -> str:
    _, hashes, reference = answer.rpartition("####")
    if not hashes or not reference.strip():
        raise ConfigError(f"{where}: the answer does not end with '#### <number>' as GSM8K's do: "
                          "read the file with jsonl() (or --dataset jsonl:PATH) instead")
    return reference.strip()


def _read(path: Path, name: str, question: str, reference: str,
          clean: Callable[[str, str], str], instruction: str) -> Dataset:
    items = tuple(_items(path, question, reference, clean))
    if not items:
        raise ConfigError(f"{path} holds no items: it needs one JSON object per line")
    return Dataset(name, items, f"{name}:{path.name}", instruction)


def _items(path: Path, question: str, reference: str,
           clean: Callable[[str, str], str]) -> Iterator[Item]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the dataset {path}: {exc.strerror or exc}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        row = _object(line, where)
        yield Item(f"{path.stem}-{number}", _field(row, question, where),
                   clean(_field(row, reference, where), where))


def _object(line: str, where: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise ConfigError(f"{where} is not JSON: {exc}") from exc
    if not isinstance(row, dict):
        raise ConfigError(f"{where} must be a JSON object, got {type(row).__name__}")
    return row


def _field(row: dict[str, Any], name: str, where: str) -> str:
    value = row.get(name)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        found = ", ".join(sorted(row)) or "none"
        raise ConfigError(f"{where} has no text or number field {name!r} (its fields: {found}): "
                          "name the question and reference fields that it has")
    return str(value)
