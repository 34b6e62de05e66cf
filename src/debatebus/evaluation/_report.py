"""What an evaluation found, per arm: accuracy with its 95% interval, paired tests against the
``single`` and ``vote`` baselines, calls, tokens, latency and cost; as a terminal table, JSON,
Markdown and an SVG plot of accuracy against tokens."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec

from debatebus._usage import TokenUsage
from debatebus.evaluation._arms import Answer, Arm
from debatebus.evaluation._plot import Point, accuracy_tokens_svg
from debatebus.evaluation._statistics import (
    CONFIDENCE,
    Interval,
    mcnemar_exact,
    paired_bootstrap,
    percentile,
    wilson_interval,
)

#: The files ``Report.write`` writes into a directory (the results file sits beside them).
REPORT_FILES = {"json": "report.json", "markdown": "report.md", "svg": "accuracy-tokens.svg"}


class ItemResult(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """One arm's answer to one item, graded: a line of the results file."""

    item: str
    arm: str
    answer: str
    correct: bool
    latency_s: float
    calls: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    failed: bool = False
    error: str | None = None
    rounds: int | None = None
    satisfied: bool | None = None

    @classmethod
    def of(cls, item: str, arm: str, answer: Answer, correct: bool, latency_s: float) -> ItemResult:
        usage = answer.usage
        return cls(item, arm, answer.text, correct, latency_s, answer.calls,
                   usage.prompt_tokens if usage else None,
                   usage.completion_tokens if usage else None,
                   answer.cost, answer.failed, answer.error, answer.rounds, answer.satisfied)

    def answer_spent(self) -> Answer:
        """What a vote matched to this arm reads: its answer and what it spent."""
        usage = None
        if self.prompt_tokens is not None and self.completion_tokens is not None:
            usage = TokenUsage.of(self.prompt_tokens, self.completion_tokens)
        return Answer(self.answer, self.calls, usage, self.cost, self.failed, self.error,
                      self.rounds, self.satisfied)


@dataclass(frozen=True, slots=True)
class Paired:
    """An arm against a baseline over the same items: ``wins`` items only the arm got right,
    ``losses`` only the baseline; the exact McNemar p-value; the accuracy difference and, with a
    bootstrap, its 95% interval."""

    baseline: str
    wins: int
    losses: int
    p_value: float
    difference: float
    bootstrap: Interval | None = None


@dataclass(frozen=True, slots=True)
class ArmSummary:
    """One arm over every item. Calls and tokens are means per item (None when a result did not
    say); ``cost`` is the total, when every item's is known; latency in seconds per item."""

    name: str
    kind: str
    items: int
    correct: int
    accuracy: float
    interval: Interval
    calls: float | None
    prompt_tokens: float | None
    completion_tokens: float | None
    latency_p50_s: float
    latency_p95_s: float
    cost: float | None
    failed: int
    #: Debates whose stop rule (judge, until) ended them; None for arms that are no debate.
    satisfied: int | None
    vs_single: Paired | None
    vs_vote: Paired | None

    @property
    def tokens(self) -> float | None:
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def _paired(name: str, baseline: str | None, by_arm: Mapping[str, Sequence[ItemResult]],
            bootstrap: int, seed: int) -> Paired | None:
    """Arm ``name`` against ``baseline`` (None: no such baseline, or the arm is it)."""
    if baseline is None or name == baseline:
        return None
    results = by_arm[name]
    theirs = [r.correct for r in by_arm[baseline]]
    ours = [r.correct for r in results]
    wins = sum(a and not b for a, b in zip(ours, theirs, strict=True))
    losses = sum(b and not a for a, b in zip(ours, theirs, strict=True))
    interval = (paired_bootstrap(ours, theirs, resamples=bootstrap, seed=seed)
                if bootstrap else None)
    return Paired(baseline, wins, losses, mcnemar_exact(wins, losses),
                  (sum(ours) - sum(theirs)) / len(ours), interval)


def _summary(arm: Arm, results: Sequence[ItemResult], baselines: tuple[str | None, str | None],
             by_arm: Mapping[str, Sequence[ItemResult]], bootstrap: int,
             seed: int) -> ArmSummary:
    n = len(results)
    correct = sum(r.correct for r in results)
    latencies = [r.latency_s for r in results]
    costs = [r.cost for r in results]
    satisfied = [r.satisfied for r in results if r.satisfied is not None]
    return ArmSummary(
        arm.name, arm.kind, n, correct, correct / n, wilson_interval(correct, n),
        _mean([r.calls for r in results]), _mean([r.prompt_tokens for r in results]),
        _mean([r.completion_tokens for r in results]),
        percentile(latencies, 0.5), percentile(latencies, 0.95),
        sum(c for c in costs if c is not None) if None not in costs else None,
        sum(r.failed for r in results), sum(satisfied) if satisfied else None,
        _paired(arm.name, baselines[0], by_arm, bootstrap, seed),
        _paired(arm.name, baselines[1], by_arm, bootstrap, seed),
    )


def build_report(config: Mapping[str, Any], arms: Sequence[Arm],
                 by_arm: Mapping[str, Sequence[ItemResult]], *, bootstrap: int = 0,
                 seed: int = 0) -> Report:
    """The report of ``by_arm`` (each arm's results, in the same item order)."""
    first = {kind: next((a.name for a in arms if a.kind == kind), None)
             for kind in ("single", "vote")}
    baselines = (first["single"], first["vote"])
    summaries = [_summary(arm, by_arm[arm.name], baselines, by_arm, bootstrap, seed)
                 for arm in arms]
    return Report(dict(config), summaries, {name: list(rs) for name, rs in by_arm.items()})


# --- how it is shown -----------------------------------------------------------------------------


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _number(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _versus(paired: Paired | None) -> str:
    if paired is None:
        return "—"
    shown = f"+{paired.wins}/−{paired.losses} p={paired.p_value:.3g}"
    if paired.bootstrap is not None:
        shown += f" Δ {_pct(paired.bootstrap.low)}…{_pct(paired.bootstrap.high)}"
    return shown


COLUMNS = ("arm", "accuracy", f"{CONFIDENCE:.0%} CI", "vs single", "vs vote", "calls",
           "prompt tok", "compl tok", "p50 s", "p95 s", "cost")


def _row(s: ArmSummary) -> tuple[str, ...]:
    return (s.name, _pct(s.accuracy), f"{_pct(s.interval.low)}–{_pct(s.interval.high)}",
            _versus(s.vs_single), _versus(s.vs_vote), _number(s.calls),
            _number(s.prompt_tokens, 0), _number(s.completion_tokens, 0),
            f"{s.latency_p50_s:.2f}", f"{s.latency_p95_s:.2f}",
            "—" if s.cost is None else f"${s.cost:,.4f}")


@dataclass(frozen=True)
class Report:
    """``config``: what was run (dataset, arms, models, grader, seed, run id); ``arms``: one
    summary per arm, in the arms' order; ``results``: every graded answer, per arm."""

    config: dict[str, Any]
    arms: list[ArmSummary]
    results: dict[str, list[ItemResult]]

    def arm(self, name: str) -> ArmSummary:
        return next(s for s in self.arms if s.name == name)

    def rows(self) -> list[tuple[str, ...]]:
        """The table's rows under ``COLUMNS``, as shown."""
        return [_row(s) for s in self.arms]

    def table(self) -> str:
        """The table for a terminal: aligned columns, then the interval's level and the tests."""
        rows = [COLUMNS, *self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                 for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join([*lines, "", _LEGEND])

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config,
                "arms": [asdict(s) | {"tokens": s.tokens} for s in self.arms]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def markdown(self) -> str:
        config = self.config
        dataset = config.get("dataset", {})
        lines = [
            "# Evaluation", "",
            f"{dataset.get('items', '?')} items from {dataset.get('source', '?')}, graded "
            f"{config.get('grader', {}).get('grader', '?')}; seed {config.get('seed')}, run "
            f"{config.get('runId', '?')}.", "",
            "| " + " | ".join(COLUMNS) + " |",
            "|" + "---|" * len(COLUMNS),
            *("| " + " | ".join(row) + " |" for row in self.rows()),
            "", _LEGEND, "", "## Configuration", "", "```json",
            json.dumps(config, indent=2, ensure_ascii=False, sort_keys=True), "```", "",
        ]
        return "\n".join(lines)

    def svg(self) -> str:
        """The plot of accuracy (with its interval) against tokens per item, one point per arm."""
        return accuracy_tokens_svg([Point(s.name, s.tokens, s.accuracy, s.interval.low,
                                          s.interval.high) for s in self.arms])

    def write(self, directory: str | Path) -> dict[str, Path]:
        """``report.json``, ``report.md`` and ``accuracy-tokens.svg`` in ``directory``."""
        where = Path(directory)
        where.mkdir(parents=True, exist_ok=True)
        written = {}
        for kind, text in (("json", self.to_json()), ("markdown", self.markdown()),
                           ("svg", self.svg())):
            path = where / REPORT_FILES[kind]
            path.write_text(text + "\n", encoding="utf-8")
            written[kind] = path
        return written


_LEGEND = (
    f"accuracy: the share of items right, with its {CONFIDENCE:.0%} Wilson interval; calls, "
    "tokens: means per item.\nvs single, vs vote: +items only this arm got right, −items only "
    "the baseline did; p: exact McNemar (Δ: paired bootstrap interval of the difference)."
)

