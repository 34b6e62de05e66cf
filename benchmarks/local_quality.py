"""The embedded model's debate quality: 10 demo debates on the fixed questions in
``local_questions.txt``, in process.

    python benchmarks/local_quality.py [--rounds 2] [--threads 2] [--questions N]

Each debate is ``debatebus._demo``'s (3 participants, a moderator and a judge, word limits). It
prints, per debate and in total: turns that contain another speaker's tag (goal 0), verdicts
that parsed (goal: every one), empty or over-limit turns (goal 0), Φ̂, seconds per debate, and the
prompt tokens llama.cpp evaluated against those it was sent (the rest was a reused prefix).
Figures are printed, not asserted: the model samples and the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from debatebus._demo import DEMO_WORD_LIMITS, build_debate
from debatebus.engine import DebateResult, Verdict
from debatebus.engine._transcript import Turn
from debatebus.llm._local import LocalLLM, default_model_path

QUESTIONS = Path(__file__).with_name("local_questions.txt")
SPEAKERS = ("optimist", "critic", "pragmatist", "moderator", "judge")


def questions(limit: int) -> list[str]:
    lines = QUESTIONS.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip()][:limit]


def foreign_tag(text: str, speaker: str) -> bool:
    """Whether ``text`` holds a turn of someone else: any ``[tag]``, or a line opened by another
    speaker's name (checked here independently of the engine's own clean-up)."""
    others = "|".join(re.escape(n) for n in SPEAKERS if n != speaker)
    named = re.compile(rf"^\W*(?:{others})(?: said)?\s*:", re.IGNORECASE | re.MULTILINE)
    return bool(re.search(r"\[[^\]\n]{1,40}\]", text) or named.search(text))


def bad_length(turn: Turn, limit: int | None) -> bool:
    words = len(turn.text.split())
    return words == 0 or (limit is not None and words > limit)


@dataclass
class Tally:
    tagged: int = 0
    turns: int = 0
    bad_length: int = 0
    verdicts: int = 0
    parsed: int = 0
    debates_all_parsed: int = 0

    def add(self, result: DebateResult) -> list[str]:
        """Count ``result``; its summary line, then each offending turn quoted."""
        turns = [(t, DEMO_WORD_LIMITS.get(r.phase)) for r in result.rounds for t in r.turns]
        if result.synthesis is not None:
            synthesis = Turn(speaker="moderator", round=0, text=result.synthesis)
            turns.append((synthesis, DEMO_WORD_LIMITS["synthesis"]))
        shown = [
            f"      {problem}: {turn.speaker} r{turn.round}: {turn.text[:160]!r}"
            for turn, limit in turns
            for problem, found in (
                ("tagged", foreign_tag(turn.text, turn.speaker)),
                ("length", bad_length(turn, limit)),
            )
            if found
        ]
        tagged = sum(line.lstrip().startswith("tagged") for line in shown)
        parsed = sum(
            isinstance(r.verdict, Verdict) and bool(r.verdict.summary.strip())
            for r in result.rounds
        )
        self.tagged += tagged
        self.bad_length += len(shown) - tagged
        self.turns += len(turns)
        self.verdicts += len(result.rounds)
        self.parsed += parsed
        self.debates_all_parsed += result.ok and parsed == len(result.rounds)
        summary = f"tagged {tagged}, verdicts {parsed}/{len(result.rounds)}, bad length "
        return [summary + str(len(shown) - tagged), *shown]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--questions", type=int, default=10)
    args = parser.parse_args()
    llm = LocalLLM(default_model_path(), n_threads=args.threads, seed=1)
    debate = build_debate(llm, judge=True, rounds=args.rounds)
    tally, seconds, phis = Tally(), [], []
    asked = questions(args.questions)
    for number, question in enumerate(asked, 1):
        started = time.perf_counter()
        result = await debate.run(question)
        seconds.append(time.perf_counter() - started)
        if result.phi_hat is not None:
            phis.append(result.phi_hat)
        line, *shown = tally.add(result)
        status = "ok" if result.ok else f"FAILED: {result.error}"
        phi = "-" if result.phi_hat is None else f"{result.phi_hat:.2f}"
        print(f"{number:2}. {seconds[-1]:5.1f} s  {line}  Φ̂ {phi}  {status}", *shown, sep="\n",
              flush=True)
    stats = llm.stats
    print(f"\ndebates                           : {len(asked)} ({args.rounds} rounds, judge)")
    print(f"turns with another speaker's tag  : {tally.tagged} of {tally.turns}")
    print(f"debates whose verdicts all parsed : {tally.debates_all_parsed}/{len(asked)}"
          f" ({tally.parsed}/{tally.verdicts} verdicts)")
    print(f"empty or over-limit turns         : {tally.bad_length} of {tally.turns}")
    if phis:
        print(f"Φ̂ (median, min–max)               : {statistics.median(phis):.2f}"
              f" ({min(phis):.2f}–{max(phis):.2f})")
    print(f"seconds per debate (median)       : {statistics.median(seconds):.1f}"
          f" (min {min(seconds):.1f}, max {max(seconds):.1f})")
    print(f"prompt tokens per debate          : {stats.prompt_tokens / len(asked):.0f} sent, "
          f"{stats.evaluated / len(asked):.0f} evaluated "
          f"({stats.reused / max(stats.prompt_tokens, 1):.0%} reused)")


if __name__ == "__main__":
    asyncio.run(main())
