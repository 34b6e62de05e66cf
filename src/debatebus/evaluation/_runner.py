"""Running an evaluation: every item through every arm, graded, each result stored as it finishes.

With a results file (JSONL) an interrupted evaluation resumes: the items and arms it finished are
read back, not asked again (nothing is paid twice). The file starts with a header naming the
evaluation (its fingerprint: the items, arms, models, grader and instruction); a file of another
evaluation is refused rather than mixed in.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from debatebus.evaluation._arms import Answer, Arm, Ask
from debatebus.evaluation._datasets import Dataset, Item
from debatebus.evaluation._graders import Grader, NumericGrader
from debatebus.evaluation._report import ItemResult, Report, build_report
from debatebus.exceptions import ConfigError

_HEADER = "debatebus-evaluation"


@dataclass(frozen=True, slots=True)
class Progress:
    """After each item and arm: how many of ``total`` are done (resumed ones included)."""

    done: int
    total: int
    result: ItemResult
    #: Read back from the results file, not asked again.
    resumed: bool


ProgressHook = Callable[[Progress], None]


class ItemLog:
    """The results file: a header line, then one ``ItemResult`` per line, each written and
    flushed to disk as its item finishes. None for ``path`` keeps them in memory only."""

    def __init__(self, path: Path | None, fingerprint: str, *, fresh: bool = False) -> None:
        self.fingerprint = fingerprint
        self.run_id = uuid.uuid4().hex[:12]
        self.done: dict[tuple[str, str], ItemResult] = {}
        self._file: IO[bytes] | None = None
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if not fresh and path.exists() and path.stat().st_size and self._read(path):
            self._file = path.open("ab")
            return
        # A new file, or one cut mid-line by a kill: written whole from what was read.
        self._file = path.open("wb")
        self._write(json.dumps({"kind": _HEADER, "fingerprint": fingerprint,
                                "runId": self.run_id}).encode(),
                    *(msgspec.json.encode(result) for result in self.done.values()))

    def _read(self, path: Path) -> bool:
        """Load the stored results; whether the file ends whole (not cut mid-line)."""
        data = path.read_bytes()
        lines = data.splitlines()
        header = _header(lines[0], path)
        if header.get("fingerprint") != self.fingerprint:
            raise ConfigError(
                f"{path} holds the results of another evaluation (its dataset, arms, models, "
                "grader or instruction differ): pass fresh=True (--fresh) to start over, or "
                "write to another file")
        self.run_id = str(header.get("runId", self.run_id))
        decoder = msgspec.json.Decoder(ItemResult)
        for number, line in enumerate(lines[1:], 2):
            try:
                result = decoder.decode(line)
            except msgspec.DecodeError:
                if number == len(lines):  # cut short by a kill mid-write: asked again
                    return False
                raise ConfigError(f"{path}:{number} is not a stored result: fix or remove the "
                                  "line, or pass fresh=True (--fresh)") from None
            self.done[result.item, result.arm] = result
        return data.endswith(b"\n")

    def _write(self, *lines: bytes) -> None:
        assert self._file is not None
        self._file.writelines(line + b"\n" for line in lines)
        self._file.flush()
        os.fsync(self._file.fileno())

    def add(self, result: ItemResult) -> None:
        self.done[result.item, result.arm] = result
        if self._file is not None:
            self._write(msgspec.json.encode(result))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _header(line: bytes, path: Path) -> dict[str, Any]:
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("kind") != _HEADER:
        raise ConfigError(f"{path} is not a debatebus evaluation's results file: write the "
                          "results to another file")
    return header


@dataclass(frozen=True)
class Evaluation:
    """Every item of ``dataset`` through every arm, graded by ``grader``.

    ``models``: the model strings to record in the report (e.g. ``{"llm": "openai:gpt-4o"}``).
    ``concurrency``: items in flight at once (each item's arms run one after another).
    ``bootstrap``: resamples of a paired bootstrap beside McNemar's test (0: none), drawn with
    ``seed``. The report records all of it."""

    dataset: Dataset
    arms: Sequence[Arm]
    grader: Grader = field(default_factory=NumericGrader)
    seed: int = 0
    models: Mapping[str, str] = field(default_factory=dict)
    concurrency: int = 1
    bootstrap: int = 0

    def __post_init__(self) -> None:
        if not self.dataset.items:
            raise ConfigError(f"the dataset {self.dataset.name!r} has no items to evaluate")
        names = [arm.name for arm in self.arms]
        if not names:
            raise ConfigError("an evaluation needs at least one arm")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"arm names must differ: {twice} given twice (pass name=…)")
        for arm in self.arms:
            target = arm.matched_to
            if target is not None and target not in names:
                raise ConfigError(f"arm {arm.name!r} is matched to {target!r}, which is not "
                                  f"one of the arms {names}")
            if target is not None and self._arm(target).matched_to is not None:
                raise ConfigError(f"arm {arm.name!r} is matched to {target!r}, itself matched "
                                  "to another: match it to an arm that is not")
        if self.concurrency < 1 or self.bootstrap < 0:
            raise ConfigError(f"concurrency must be ≥ 1 and bootstrap ≥ 0, got "
                              f"{self.concurrency} and {self.bootstrap}")

    def _arm(self, name: str) -> Arm:
        return next(arm for arm in self.arms if arm.name == name)

    def config(self) -> dict[str, Any]:
        """What the report records: enough to run the same evaluation again."""
        return {
            "dataset": {"name": self.dataset.name, "source": self.dataset.source,
                        "items": len(self.dataset.items),
                        "instruction": self.dataset.instruction},
            "arms": {arm.name: arm.describe() for arm in self.arms},
            "grader": self.grader.describe(),
            "models": dict(self.models),
            "seed": self.seed,
            "bootstrap": self.bootstrap,
        }

    def fingerprint(self) -> str:
        """What the stored results depend on: the items, arms, models, grader and instruction
        (not the bootstrap, which is computed from them)."""
        config = self.config()
        document = {**{k: config[k] for k in ("dataset", "arms", "grader", "models")},
                    "itemIds": [item.id for item in self.dataset.items]}
        encoded = json.dumps(document, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(encoded.encode()).hexdigest()[:16]

    async def run(self, results: str | Path | None = None, *, fresh: bool = False,
                  on_progress: ProgressHook | None = None) -> Report:
        """Run what ``results`` (a JSONL file) does not hold yet, store each result there as it
        finishes, and report on all of them. ``fresh``: start the file over."""
        log = ItemLog(Path(results) if results is not None else None, self.fingerprint(),
                      fresh=fresh)
        try:
            await _Pass(self, log, on_progress).run()
        finally:
            log.close()
        by_arm = {arm.name: [log.done[item.id, arm.name] for item in self.dataset.items]
                  for arm in self.arms}
        return build_report({**self.config(), "runId": log.run_id}, list(self.arms), by_arm,
                            bootstrap=self.bootstrap, seed=self.seed)


class _Pass:
    """One pass over the items not stored yet."""

    def __init__(self, evaluation: Evaluation, log: ItemLog,
                 on_progress: ProgressHook | None) -> None:
        self.evaluation, self.log, self.on_progress = evaluation, log, on_progress
        arms = evaluation.arms
        self.order = [a for a in arms if a.matched_to is None] + [
            a for a in arms if a.matched_to is not None]
        self.total = len(evaluation.dataset.items) * len(arms)
        self.done = 0

    async def run(self) -> None:
        items = self._todo()
        workers = min(self.evaluation.concurrency, len(items))
        queue = iter(items)
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(workers):
                    group.create_task(self._work(queue))
        except BaseExceptionGroup as failed:  # the first failure, as the caller would see it
            raise failed.exceptions[0] from None

    def _todo(self) -> list[Item]:
        """The items with an arm left to run; the others are reported as resumed at once."""
        todo = []
        for item in self.evaluation.dataset.items:
            stored = [self.log.done.get((item.id, arm.name)) for arm in self.order]
            if all(stored):
                for result in stored:
                    assert result is not None
                    self._progress(result, resumed=True)
            else:
                todo.append(item)
        return todo

    async def _work(self, queue: Iterator[Item]) -> None:
        for item in queue:  # shared by the workers: each takes the next item
            await self._item(item)

    async def _item(self, item: Item) -> None:
        answers: dict[str, Answer] = {}
        for arm in self.order:
            result = self.log.done.get((item.id, arm.name))
            resumed = result is not None
            if result is None:
                result = await self._ask(arm, item, answers)
                self.log.add(result)
            answers[arm.name] = result.answer_spent()
            self._progress(result, resumed=resumed)

    async def _ask(self, arm: Arm, item: Item, answers: Mapping[str, Answer]) -> ItemResult:
        evaluation = self.evaluation
        ask = Ask(evaluation.dataset.prompt(item), f"eval-{self.log.run_id}-{arm.name}-{item.id}",
                  evaluation.grader,
                  answers[arm.matched_to] if arm.matched_to is not None else None)
        started = time.perf_counter()
        answer = await arm.answer(ask)
        latency = time.perf_counter() - started
        correct = not answer.failed and await evaluation.grader.grade(item, answer.text)
        return ItemResult.of(item.id, arm.name, answer, correct, latency)

    def _progress(self, result: ItemResult, *, resumed: bool) -> None:
        self.done += 1
        if self.on_progress is not None:
            self.on_progress(Progress(self.done, self.total, result, resumed))
