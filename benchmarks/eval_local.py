"""Does the debate pay on the embedded model? ``debatebus.evaluation`` with SmolLM2-135M.

    python benchmarks/eval_local.py [--items 50] [--seed 0] [--threads 2] [--out DIR]
                                    [--parts arithmetic,gsm8k,judge,server]

Parts (each stores its results in ``--out``/PART/items.jsonl: run the same command again to
resume an interrupted part without paying for its finished items):

- ``arithmetic``, ``gsm8k``: ``--items`` items each (Du et al.'s arithmetic generated with
  ``--seed``; GSM8K's test split, ``../shared/data/gsm8k/test.jsonl`` beside the checkout, drawn
  with ``--seed``) through four arms: ``single``; ``vote``, the majority of as many samples as the
  round-robin made calls on the item; ``round-robin-3x2`` (3 solvers, 2 rounds, the majority of
  the last round); ``cross-pollination-3x2`` (3 solvers, positions then revisions, its synthesis).
- ``judge``: the demo debate (``debatebus._demo``) on the arithmetic items, as it was before #27:
  ``min_rounds=1`` and the judge's consensus flag alone ending it. How often the judge stops it
  after round 1, whether its answer is right then, and how many of those verdicts said nothing
  (an empty or boilerplate summary, which no longer counts as consensus).
- ``server``: the first 10 arithmetic items, ``single``, ``vote`` and the round-robin, through
  ``python -m llama_cpp.server`` (OpenAICompatibleLLM) with the same model: the remote path,
  measured the same way (its prompt tokens match the in-process run's call for call).

Figures are printed, not asserted: the model samples, and a 135M model is expected to score low.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from debatebus._demo import build_debate
from debatebus.engine import DebateState
from debatebus.engine._rules import empty_verdict
from debatebus.evaluation import (
    Dataset,
    DebateArm,
    Evaluation,
    ItemResult,
    Progress,
    Report,
    Single,
    Vote,
    arithmetic,
    gsm8k,
)
from debatebus.evaluation._arms import solver_debate
from debatebus.llm import LLM
from debatebus.llm._local import LocalLLM, default_model_path

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
PARTS = ("arithmetic", "gsm8k", "judge", "server")
#: The longest answer of a single or vote call, in tokens.
MAX_TOKENS = 96
#: Every debate phase's word limit (a token budget of 84, close to MAX_TOKENS).
WORDS = 48
WORD_LIMITS = dict.fromkeys(("opening", "rebuttal", "position", "revision", "synthesis"), WORDS)
SERVER_ITEMS = 10


def arms(llm: LLM, *, cross_pollination: bool = True) -> list[DebateArm | Single | Vote]:
    rr = DebateArm(solver_debate(llm, agents=3, rounds=2, word_limits=WORD_LIMITS),
                   name="round-robin-3x2", final="majority")
    made: list[DebateArm | Single | Vote] = [
        Single(llm, max_tokens=MAX_TOKENS),
        Vote(llm, matched_to=rr.name, max_tokens=MAX_TOKENS),
        rr,
    ]
    if cross_pollination:
        made.append(DebateArm(solver_debate(llm, protocol="cross-pollination", agents=3,
                                            word_limits=WORD_LIMITS),
                              name="cross-pollination-3x2", final="output"))
    return made


def local(args: argparse.Namespace) -> LocalLLM:
    return LocalLLM(default_model_path(), n_threads=args.threads, max_tokens=MAX_TOKENS,
                    seed=args.seed + 1)


def progress(label: str) -> Callable[[Progress], None]:
    started = time.monotonic()

    def show(p: Progress) -> None:
        if p.done == p.total or p.done % 10 == 0:
            print(f"  {label}: {p.done}/{p.total} after {time.monotonic() - started:.0f} s",
                  file=sys.stderr, flush=True)

    return show


async def evaluate(label: str, dataset: Dataset, chosen: list[DebateArm | Single | Vote],
                   args: argparse.Namespace, models: dict[str, str]) -> Report:
    evaluation = Evaluation(dataset, chosen, seed=args.seed, models=models, bootstrap=2000)
    started = time.monotonic()
    report = await evaluation.run(args.out / label / "items.jsonl", on_progress=progress(label))
    report.write(args.out / label)
    print(f"\n## {label}: {dataset.source} ({time.monotonic() - started:.0f} s this run)\n")
    print(report.table())
    return report


def judge_study(report: Report, dataset: Dataset, verdicts: dict[str, dict[int, tuple[bool, bool]]],
                max_rounds: int) -> None:
    """What the judge did after round 1, and whether the debate was right then."""
    prompts = {item.id: dataset.prompt(item) for item in dataset.items}
    results = report.results["demo"]
    stopped = [r for r in results if r.satisfied and (r.rounds or 0) < max_rounds]
    first = [verdicts.get(prompts[r.item], {}).get(1) for r in results]
    agreed = [(r, v) for r, v in zip(results, first, strict=True) if v is not None and v[0]]
    said_nothing = [r for r, v in agreed if v[1]]
    substantive = [r for r, v in agreed if not v[1]]

    def right(rs: list[ItemResult]) -> str:
        return f"{sum(r.correct for r in rs)}/{len(rs)}" if rs else "0/0"

    print("\n## judge: the demo debate, min_rounds=1 and the consensus flag alone (before #27)\n")
    print(f"- debates: {len(results)}; right: {right(results)}")
    print(f"- stopped after round 1 (of {max_rounds}): {len(stopped)}; right then: {right(stopped)}")
    print(f"- round-1 verdicts with consensus: {len(agreed)}; of them with an empty or "
          f"boilerplate summary: {len(said_nothing)} (right then: {right(said_nothing)})")
    print(f"- so with the new verdict rule alone (min_rounds=1) it stops after round 1 in "
          f"{len(substantive)} (right then: {right(substantive)}); with the demo's min_rounds=2, "
          "in none")
    played = [r for r in results if r not in stopped]
    print(f"- debates that went on to round {max_rounds}: {len(played)}; right: {right(played)}")


def common_summaries(store: Path) -> None:
    """The round-1 summaries of the verdicts that ruled consensus, most common first."""
    rows = [json.loads(line) for line in store.read_text().splitlines()]
    said = Counter(row["summary"] for row in rows if row["round"] == 1 and row["consensus"])
    for summary, count in said.most_common(3):
        print(f"  {count} × {summary!r}")


async def run_judge(args: argparse.Namespace, dataset: Dataset) -> None:
    store = args.out / "judge" / "verdicts.jsonl"
    store.parent.mkdir(parents=True, exist_ok=True)
    verdicts: dict[str, dict[int, tuple[bool, bool]]] = {}
    if store.exists():
        for line in store.read_text().splitlines():
            row = json.loads(line)
            verdicts.setdefault(row["question"], {})[row["round"]] = (row["consensus"], row["empty"])

    def consensus_flag(state: DebateState) -> bool:
        """The stop rule before #27: the latest verdict's consensus flag, whatever it says."""
        verdict = state.verdict
        agreed = verdict is not None and getattr(verdict, "consensus", False) is True
        empty = verdict is not None and empty_verdict(verdict)
        verdicts.setdefault(state.question, {})[state.round] = (agreed, empty)
        with store.open("a") as out:
            out.write(json.dumps({"question": state.question, "round": state.round,
                                  "consensus": agreed, "empty": empty,
                                  "summary": getattr(verdict, "summary", None)}) + "\n")
        return agreed

    llm = local(args)
    demo = dataclasses.replace(build_debate(llm), min_rounds=1, until=consensus_flag)
    report = await evaluate("judge", dataset, [DebateArm(demo, name="demo")], args,
                            {"llm": "local"})
    judge_study(report, dataset, verdicts, demo.spec.max_rounds)
    print("- the most common round-1 summaries with consensus:")
    common_summaries(store)


async def run_server(args: argparse.Namespace, in_process: Report | None) -> None:
    from local_llm import llama_server  # benchmarks/local_llm.py, beside this script

    from debatebus.llm._openai_compat import OpenAICompatibleLLM

    dataset = arithmetic(min(SERVER_ITEMS, args.items), seed=args.seed)
    with llama_server(default_model_path(), args.threads, "--n_ctx", "4096") as base_url:
        llm = OpenAICompatibleLLM("smollm2", base_url=base_url, max_tokens=MAX_TOKENS,
                                  temperature=0.7, timeout=600)
        report = await evaluate("server", dataset, arms(llm, cross_pollination=False), args,
                                {"llm": "openai:smollm2@llama_cpp.server"})
    if in_process is None:
        return
    print(f"\nthe same {len(dataset.items)} items in process (from the arithmetic part):")
    ids = {item.id for item in dataset.items}
    for arm in ("single", "vote", "round-robin-3x2"):
        theirs = [r for r in in_process.results[arm] if r.item in ids]
        ours = report.results[arm]
        print(f"- {arm}: right {sum(r.correct for r in theirs)} in process, "
              f"{sum(r.correct for r in ours)} served; prompt tokens per call "
              f"{_per_call(theirs):.1f} in process, {_per_call(ours):.1f} served")


def _per_call(results: list[ItemResult]) -> float:
    calls = sum(r.calls or 0 for r in results)
    return sum(r.prompt_tokens or 0 for r in results) / calls if calls else 0.0


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("/tmp/debatebus-eval-local"))
    parser.add_argument("--parts", default=",".join(PARTS))
    args = parser.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    print(f"model {default_model_path().name}, {args.threads} threads, max_tokens {MAX_TOKENS}, "
          f"debate turns ≤ {WORDS} words, seed {args.seed}, results in {args.out}")
    numbers = arithmetic(args.items, seed=args.seed)
    in_process = None
    if "arithmetic" in parts:
        in_process = await evaluate("arithmetic", numbers, arms(local(args)), args,
                                    {"llm": "local"})
    if "gsm8k" in parts:
        if GSM8K.is_file():
            await evaluate("gsm8k", gsm8k(GSM8K).sample(args.items, args.seed),
                           arms(local(args)), args, {"llm": "local"})
        else:
            print(f"\n## gsm8k: skipped, {GSM8K} is absent (GSM8K's test split, MIT licence)")
    if "judge" in parts:
        await run_judge(args, numbers)
    if "server" in parts:
        await run_server(args, in_process)


if __name__ == "__main__":
    asyncio.run(main())
