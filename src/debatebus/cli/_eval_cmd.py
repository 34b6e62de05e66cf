"""``debatebus eval``: does the debate pay? A dataset through several arms, compared.

    debatebus eval --dataset arithmetic --items 50 --arm single --arm vote --arm round-robin:3x2

Arms (``--arm``, repeatable; default ``single``, ``vote`` and ``round-robin:3x2``, or ``fleet``
instead of the debate with ``--broker``):

- ``single``: one call. ``vote``: the majority of as many samples as the first debate arm made
  calls on the item; ``vote:tokens`` as many as its tokens; ``vote:K`` a fixed K.
- ``round-robin:AxR[+judge]`` (A solvers, R rounds; their final answer is the majority of the last
  round), ``cross-pollination:A[+judge]`` (its synthesis), ``preset:NAME[+judge]``.
- ``debate:MODULE:ATTR`` (your ``Debate``), ``handler:MODULE:ATTR`` (your async handler).
- ``fleet[:EVENT_TYPE]``: each item published to the fleet on ``--broker``, its result read back.

Progress goes to stderr, the table to stdout (``--json``: the report as JSON). Every result is
stored in ``--out``/items.jsonl as it finishes: the same command resumes an interrupted run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TextIO

from debatebus._redaction import redact
from debatebus.cli._common import load_attribute, positive_int
from debatebus.client import BusClient
from debatebus.engine._debate import Debate
from debatebus.engine._definition import Judge
from debatebus.engine._definition import Protocol as DebateProtocol
from debatebus.engine._presets import PRESETS
from debatebus.evaluation._arms import (
    Arm,
    DebateArm,
    FleetArm,
    HandlerArm,
    Single,
    Vote,
    solver_debate,
)
from debatebus.evaluation._datasets import Dataset, arithmetic, gsm8k, jsonl
from debatebus.evaluation._graders import (
    ExactGrader,
    Grader,
    JudgeGrader,
    NumericGrader,
    RegexGrader,
)
from debatebus.evaluation._report import Report
from debatebus.evaluation._runner import Evaluation, Progress
from debatebus.exceptions import ConfigError
from debatebus.llm._base import LLM
from debatebus.llm._rate_limits import with_rate_limits
from debatebus.llm._registry import DEFAULT_SPEC, ENV_VAR, resolve_llm
from debatebus.transports import broker_url, redis_server_url

#: Where the per-item results are stored, in ``--out``.
ITEMS_FILE = "items.jsonl"
_DEBATE = re.compile(r"^(?P<protocol>round-robin|cross-pollination):(?P<agents>\d+)"
                     r"(?:x(?P<rounds>\d+))?(?P<judge>\+judge)?$")
_PRESET = re.compile(r"^preset:(?P<name>[\w-]+)(?P<judge>\+judge)?$")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "eval", help="compare debates with one call and a vote at equal compute",
        description="Run a dataset through several arms (one call, a vote matched to a debate's "
        "calls, debates, a fleet) and report each arm's accuracy with its 95% interval, paired "
        "tests against the single and vote arms, calls, tokens, latency and cost.")
    parser.add_argument("--dataset", default="arithmetic", metavar="SOURCE",
                        help="arithmetic (Du et al.'s, generated with --seed), gsm8k:PATH or "
                        "jsonl:PATH")
    parser.add_argument("--items", type=positive_int, default=50, metavar="N",
                        help="items to evaluate (a file's are drawn with --seed)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the arithmetic items, the draw from a file and the bootstrap")
    parser.add_argument("--question-field", default="question", metavar="NAME",
                        help="jsonl: the question's field")
    parser.add_argument("--reference-field", default="answer", metavar="NAME",
                        help="jsonl: the reference answer's field")
    parser.add_argument("--instruction", metavar="TEXT",
                        help="asked after every question (default: the dataset's own)")
    parser.add_argument("--grader", default="numeric", metavar="GRADER",
                        help="numeric (the last number), exact, regex:PATTERN or judge (a model "
                        "grades: --grader-llm, else --llm)")
    parser.add_argument("--llm", metavar="MODEL",
                        help="the model of the arms run here: local, openai:MODEL, "
                        "openai:MODEL@URL, anthropic:MODEL, scripted:FILE.json (default: "
                        "$DEBATEBUS_LLM, else local)")
    parser.add_argument("--grader-llm", metavar="MODEL", help="the judge grader's model")
    parser.add_argument("--arm", action="append", metavar="SPEC",
                        help="an arm (repeatable): single, vote[:tokens|:K], "
                        "round-robin:AxR[+judge], cross-pollination:A[+judge], "
                        "preset:NAME[+judge], debate:MODULE:ATTR, handler:MODULE:ATTR, "
                        "fleet[:EVENT_TYPE] (default: single, vote, round-robin:3x2; with "
                        "--broker, fleet instead of the debate)")
    parser.add_argument("--broker", metavar="URL",
                        help="the broker of a running fleet, for the fleet arm (and its Redis's "
                        "rate limits for the arms run here); without it every arm runs in this "
                        "process")
    parser.add_argument("--event-type", default="debate:request", metavar="TYPE",
                        help="the fleet arm's event type")
    parser.add_argument("--concurrency", type=positive_int, default=1, metavar="N",
                        help="items in flight at once")
    parser.add_argument("--bootstrap", type=int, default=0, metavar="N",
                        help="resamples of a paired bootstrap beside McNemar's test "
                        "(default 0: none)")
    parser.add_argument("--out", type=Path, default=Path("debatebus-eval"), metavar="DIR",
                        help=f"where {ITEMS_FILE}, report.json, report.md and "
                        "accuracy-tokens.svg go")
    parser.add_argument("--fresh", action="store_true",
                        help=f"start over instead of resuming from {ITEMS_FILE}")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    """Exit code 0 when the evaluation finished (whatever it found), 2 when it could not run."""
    try:
        dataset = _dataset(args)
        model = _Model(args)
        grader = _grader(args, model)
        async with _client(args) as client:
            arms = _arms(args, model, client)
            evaluation = Evaluation(
                dataset, arms, grader, seed=args.seed, models=_models(args, model),
                concurrency=args.concurrency, bootstrap=args.bootstrap)
            report = await _evaluate(evaluation, args)
    except ImportError as exc:  # a provider's optional extra is missing; the message says which
        print(f"debatebus: {exc}", file=sys.stderr)
        return 2
    written = report.write(args.out)
    print(report.to_json() if args.json else report.table())
    print(f"written: {', '.join(str(p) for p in written.values())}", file=sys.stderr)
    return 0


async def _evaluate(evaluation: Evaluation, args: argparse.Namespace) -> Report:
    bar = ProgressBar(sys.stderr)
    try:
        return await evaluation.run(args.out / ITEMS_FILE, fresh=args.fresh, on_progress=bar)
    finally:
        bar.close()


class _Model:
    """The model of the arms run here, resolved the first time an arm (or the judge grader) asks
    for it: a fleet-only evaluation needs none. Behind the rate limits of
    ``$DEBATEBUS_RATE_LIMITS``; with a Redis ``--broker``, the fleet-wide ones its workers share."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.spec: str | None = args.llm
        self.broker: str | None = args.broker
        self._llm: LLM | None = None

    def __call__(self) -> LLM:
        if self._llm is None:
            self._llm = with_rate_limits(resolve_llm(self.spec),
                                         redis_url=self._redis())
        return self._llm

    def _redis(self) -> str | None:
        """The shared rate limits' Redis: the broker's, when it is Redis."""
        return None if self.broker is None else redis_server_url(self.broker)

    @property
    def used(self) -> bool:
        return self._llm is not None


def _dataset(args: argparse.Namespace) -> Dataset:
    source: str = args.dataset
    kind, _, path = source.partition(":")
    if kind == "arithmetic" and not path:
        dataset = arithmetic(args.items, seed=args.seed)
    elif kind == "gsm8k" and path:
        dataset = gsm8k(path).sample(args.items, args.seed)
    elif kind == "jsonl" and path:
        dataset = jsonl(path, question=args.question_field,
                        reference=args.reference_field).sample(args.items, args.seed)
    else:
        raise ConfigError(f"--dataset {source!r}: use arithmetic, gsm8k:PATH or jsonl:PATH")
    if args.instruction is not None:
        dataset = Dataset(dataset.name, dataset.items, dataset.source, args.instruction)
    return dataset


def _grader(args: argparse.Namespace, model: _Model) -> Grader:
    spec: str = args.grader
    if spec == "numeric":
        return NumericGrader()
    if spec == "exact":
        return ExactGrader()
    if spec.startswith("regex:"):
        return RegexGrader(spec.removeprefix("regex:"))
    if spec == "judge":
        return JudgeGrader(resolve_llm(args.grader_llm) if args.grader_llm else model())
    raise ConfigError(f"--grader {spec!r}: use numeric, exact, regex:PATTERN or judge")


def _models(args: argparse.Namespace, model: _Model) -> dict[str, str]:
    """The model strings the report records (redacted: a base URL may hold a key)."""
    models = {}
    if model.used:
        models["llm"] = redact(args.llm or os.environ.get(ENV_VAR) or DEFAULT_SPEC)
    if args.grader == "judge" and args.grader_llm:
        models["grader"] = redact(args.grader_llm)
    if args.broker:
        models["broker"] = redact(broker_url(args.broker))
    return models


@contextlib.asynccontextmanager
async def _client(args: argparse.Namespace) -> AsyncIterator[BusClient | None]:
    if args.broker is None:
        yield None
        return
    async with BusClient(broker_url(args.broker)) as client:
        yield client


def _arms(args: argparse.Namespace, model: _Model, client: BusClient | None) -> list[Arm]:
    specs: list[str] = args.arm or ["single", "vote",
                                    "fleet" if client is not None else "round-robin:3x2"]
    twice = sorted({spec for spec in specs if specs.count(spec) > 1})
    if twice:
        raise ConfigError(f"--arm {twice[0]!r} is given twice: give each arm once")
    made: list[Arm] = []
    votes: list[str] = []
    for spec in specs:
        if spec == "vote" or spec.startswith("vote:"):
            votes.append(spec)
        else:
            made.append(_arm(spec, model, client, args.event_type))
    debates = [arm.name for arm in made if arm.kind not in ("single", "vote")]
    for spec in votes:
        made.append(_vote(spec, model(), debates[0] if debates else None))
    by_name = {arm.name: arm for arm in made}
    return [by_name[spec] for spec in specs]  # each arm is named by its spec


def _vote(spec: str, llm: LLM, debate: str | None) -> Vote:
    how = spec.partition(":")[2] or "calls"
    if how.isdigit():
        return Vote(llm, k=int(how), name=spec)
    if how not in ("calls", "tokens"):
        raise ConfigError(f"--arm {spec!r}: use vote, vote:tokens or vote:K (K samples)")
    if debate is None:
        raise ConfigError(f"--arm {spec!r} is matched to the first debate arm's {how}, and there "
                          "is none: add one (e.g. --arm round-robin:3x2), or use vote:K")
    return Vote(llm, matched_to=debate, match="tokens" if how == "tokens" else "calls", name=spec)


def _arm(spec: str, model: _Model, client: BusClient | None, event_type: str) -> Arm:
    if spec == "single":
        return Single(model(), name=spec)
    if spec == "fleet" or spec.startswith("fleet:"):
        if client is None:
            raise ConfigError(f"--arm {spec!r} publishes to a running fleet: pass --broker URL")
        return FleetArm(client, event_type=spec.partition(":")[2] or event_type, name=spec)
    debate = _DEBATE.match(spec)
    if debate is not None:
        protocol: DebateProtocol = (
            "round-robin" if debate["protocol"] == "round-robin" else "cross-pollination")
        rounds = int(debate["rounds"] or 2)
        made = solver_debate(model(), protocol=protocol, agents=int(debate["agents"]),
                             rounds=rounds, judge=bool(debate["judge"]))
        return DebateArm(made, name=spec,
                         final="majority" if protocol == "round-robin" else "output")
    preset = _PRESET.match(spec)
    if preset is not None:
        if preset["name"] not in PRESETS:
            raise ConfigError(f"--arm {spec!r}: no preset {preset['name']!r}; use one of "
                              f"{sorted(PRESETS)}")
        made = Debate.from_preset(preset["name"], llm=model(),
                                  judge=Judge() if preset["judge"] else None)
        return DebateArm(made, name=spec)
    return _loaded(spec)


def _loaded(spec: str) -> Arm:
    kind, _, target = spec.partition(":")
    if kind == "debate":
        debate = load_attribute(target, "--arm debate:")
        if not isinstance(debate, Debate):
            raise ConfigError(f"--arm {spec!r} is a {type(debate).__name__}, not a Debate")
        return DebateArm(debate, name=spec)
    if kind == "handler":
        handler = load_attribute(target, "--arm handler:")
        if not callable(handler):
            raise ConfigError(f"--arm {spec!r} is a {type(handler).__name__}, not a handler")
        return HandlerArm(handler, name=spec)
    raise ConfigError(f"--arm {spec!r}: use single, vote[:tokens|:K], round-robin:AxR[+judge], "
                      "cross-pollination:A[+judge], preset:NAME[+judge], debate:MODULE:ATTR, "
                      "handler:MODULE:ATTR or fleet[:EVENT_TYPE]")


class ProgressBar:
    """``[####......] 12/150  single ✓`` on a terminal, redrawn in place; a line at every tenth
    of the way elsewhere (a log, a pipe)."""

    def __init__(self, out: TextIO, width: int = 30) -> None:
        self.out, self.width = out, width
        self._shown = -1  # the tenth of the way last shown

    def __call__(self, progress: Progress) -> None:
        done, total = progress.done, progress.total
        tty = self.out.isatty()
        if not tty and done * 10 // total == self._shown and done != total:
            return
        self._shown = done * 10 // total
        filled = self.width * done // total
        mark = "✓" if progress.result.correct else "✗"
        text = (f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total}  "
                f"{progress.result.arm} {mark}{' (stored)' if progress.resumed else ''}")
        self.out.write(f"\r{text:<{self.width + 60}}" if tty else f"{text}\n")
        self.out.flush()

    def close(self) -> None:
        if self.out.isatty():
            self.out.write("\n")
            self.out.flush()

