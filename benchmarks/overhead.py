"""Orchestration overhead of the debate engine with an instant LLM.

Every model call returns a prebuilt response, so what is measured is the engine alone: prompts,
transcript rendering, accounting, judging and result building. Two shapes are timed:

* round-robin: 3 participants × 3 rounds with a moderator (framing + synthesis) and a judge that
  never reaches consensus, so all 3 rounds run (14 calls per debate);
* cross-pollination: 3 participants, positions, revisions and a synthesis (7 calls per debate).

Run: ``python benchmarks/overhead.py [--debates N] [--warmup N] [--no-uvloop]``.
Target: p99 ≤ 0.25 ms per round-robin debate.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from importlib import metadata
from typing import Any

from debatebus import Debate, Judge, Participant
from debatebus.engine import Utility, Verdict
from debatebus.llm import LLMRequest, LLMResponse, TokenUsage

TARGET_P99_MS = 0.25
TOPIC = "Should the city replace its bus fleet with electric buses by 2030?"


class InstantLLM:
    """The cheapest possible model: one prebuilt response for every call."""

    def __init__(self, response: LLMResponse) -> None:
        self.model = response.model
        self._response = response

    async def complete(self, request: LLMRequest) -> LLMResponse:
        return self._response


def _instant(text: str, structured: Verdict | None = None) -> InstantLLM:
    return InstantLLM(LLMResponse(text, structured, TokenUsage.of(120, 40), "instant"))


def round_robin_debate() -> Debate:
    speaker = _instant("Electric buses cut emissions and running costs; the grid can cope.")
    verdict = Verdict(consensus=False, summary="They still disagree on cost.")
    return Debate(
        "bench-round-robin",
        [Participant(name, f"You are {name}.") for name in ("alice", "bob", "carol")],
        llm=speaker,
        moderator=Participant("moderator", "You moderate."),
        judge=Judge(llm=_instant(verdict.model_dump_json(), verdict)),
        max_rounds=3,
    )


def cross_pollination_debate() -> Debate:
    participants = [
        Participant(name, f"You are {name}.", utility=Utility(f"{name}'s gain", "waste"))
        for name in ("alice", "bob", "carol")
    ]
    return Debate(
        "bench-cross-pollination",
        participants,
        llm=_instant("Electric buses cut emissions and running costs; the grid can cope."),
        protocol="cross-pollination",
    )


class Samples:
    """Per-debate wall-clock and CPU (thread) times, in nanoseconds."""

    def __init__(self) -> None:
        self.wall: list[int] = []
        self.cpu: list[int] = []
        self.calls = 0
        self.rounds = 0


async def _measure(debate: Debate, debates: int, warmup: int) -> Samples:
    for _ in range(warmup):
        await debate.run(TOPIC)
    gc.collect()
    samples = Samples()
    wall, cpu = samples.wall.append, samples.cpu.append
    wall_clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    for _ in range(debates):
        cpu_start = cpu_clock()
        start = wall_clock()
        result = await debate.run(TOPIC)
        wall(wall_clock() - start)
        cpu(cpu_clock() - cpu_start)
        if result.status != "completed":
            raise RuntimeError(f"benchmark debate failed: {result.error}")
    samples.calls, samples.rounds = result.calls, len(result.rounds)
    return samples


def _percentiles(ns: list[int]) -> tuple[float, float]:
    """p50 and p99 in milliseconds (nearest rank)."""
    ordered = sorted(ns)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] / 1e6

    return rank(0.50), rank(0.99)


def _report(label: str, samples: Samples) -> float:
    p50, p99 = _percentiles(samples.wall)
    cpu50, cpu99 = _percentiles(samples.cpu)
    mean = statistics.fmean(samples.wall) / 1e6
    print(
        f"{label:<18} debates={len(samples.wall)}  rounds={samples.rounds}  "
        f"calls/debate={samples.calls}\n"
        f"{'':<18} wall p50={p50:.4f} ms  p99={p99:.4f} ms  mean={mean:.4f} ms  "
        f"({p50 / samples.calls * 1000:.1f} µs per call at p50)\n"
        f"{'':<18} cpu  p50={cpu50:.4f} ms  p99={cpu99:.4f} ms  (thread time: excludes time "
        "the OS gave to other processes)"
    )
    return p99


async def _main(debates: int, warmup: int) -> bool:
    round_robin = await _measure(round_robin_debate(), debates, warmup)
    cross = await _measure(cross_pollination_debate(), debates, warmup)
    rr_p99 = _report("round-robin", round_robin)
    _report("cross-pollination", cross)
    verdict = "OK" if rr_p99 <= TARGET_P99_MS else "ABOVE TARGET"
    print(f"round-robin wall p99 target ≤ {TARGET_P99_MS} ms: {verdict}")
    return rr_p99 <= TARGET_P99_MS


def _runner(use_uvloop: bool) -> tuple[str, Callable[[Coroutine[Any, Any, bool]], bool]]:
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return f"uvloop {metadata.version('uvloop')}", uvloop.run
    return "asyncio (default loop)", asyncio.run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--debates", type=int, default=10_000, help="timed debates per protocol")
    parser.add_argument("--warmup", type=int, default=1_000, help="untimed debates first")
    parser.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    args = parser.parse_args()
    loop_name, run = _runner(not args.no_uvloop)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"python {sys.version.split()[0]}, event loop: {loop_name}, {os.cpu_count()} CPUs, "
        f"load average {load}"
    )
    run(_main(args.debates, args.warmup))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
