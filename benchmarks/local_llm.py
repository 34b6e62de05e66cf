"""The embedded model's speed: tokens/s and seconds per debate, in-process and through a server.

    python benchmarks/local_llm.py [--debates N] [--threads T] [--word-limit W]

The debate is 3 participants × 2 rounds round-robin with a judge ruling after each round (8 model
calls; ``until`` keeps it to exactly 2 rounds whatever the judge says); turns are limited to
``--word-limit`` words (60, as in the demo; 0 for none: up to MAX_TOKENS tokens). It runs first with
``LocalLLM`` in this process, then with ``OpenAICompatibleLLM`` against
``python -m llama_cpp.server`` serving the same GGUF with the same thread count. Figures are
printed, not asserted: they depend on the machine and on whatever else it is running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from debatebus import Debate, Judge, Participant
from debatebus.llm import LLM, LLMRequest, Message
from debatebus.llm._local import LocalLLM, default_model_path
from debatebus.llm._openai_compat import OpenAICompatibleLLM

TOPIC = "Should a small company adopt microservices?"
PARTICIPANTS = (
    ("optimist", "You argue for the proposal. Be concrete and brief."),
    ("critic", "You argue against the proposal. Name concrete risks. Be brief."),
    ("pragmatist", "You look for the workable middle ground. Be brief."),
)
MAX_TOKENS = 256


@dataclass
class Figures:
    label: str
    seconds: list[float]
    completion_tokens: int
    total_tokens: int
    calls: int
    generation_tps: float
    evaluated: int | None = None  # prompt tokens llama.cpp evaluated (LocalLLM only)

    def lines(self) -> list[str]:
        wall = sum(self.seconds)
        per = statistics.median(self.seconds)
        spread = (
            f" (min {min(self.seconds):.1f}, max {max(self.seconds):.1f})"
            if len(self.seconds) > 1
            else ""
        )
        return [
            f"{self.label}",
            f"  single 128-token generation : {self.generation_tps:6.1f} completion tokens/s",
            f"  seconds per debate (median) : {per:6.1f}{spread} over {len(self.seconds)} debates",
            f"  debate throughput           : {self.completion_tokens / wall:6.1f} completion tokens/s, "
            f"{self.total_tokens / wall:6.1f} total tokens/s",
            f"  per debate                  : {self.calls / len(self.seconds):.0f} calls, "
            f"{self.total_tokens / len(self.seconds):.0f} tokens",
            *self._reuse_lines(),
        ]

    def _reuse_lines(self) -> list[str]:
        if self.evaluated is None:
            return []
        n = len(self.seconds)
        prompt = (self.total_tokens - self.completion_tokens) / n
        evaluated = self.evaluated / n
        return [
            f"  prompt tokens per debate    : {prompt:.0f} sent, {evaluated:.0f} evaluated, "
            f"{prompt - evaluated:.0f} reused from the previous call's prefix"
        ]


def build_debate(llm: LLM, word_limit: int) -> Debate:
    participants = [Participant(name, prompt) for name, prompt in PARTICIPANTS]
    limits = {"opening": word_limit, "rebuttal": word_limit} if word_limit else None
    return Debate(
        "benchmark",
        participants,
        llm=llm,
        judge=Judge(),
        max_rounds=2,
        until=lambda state: False,
        word_limits=limits,
    )


async def generation_speed(llm: LLM) -> float:
    """Completion tokens/s of one warm call asked for 128 tokens (prompt processing included)."""
    request = LLMRequest(
        "You are a storyteller.",
        (Message("user", "Tell a long story about a lighthouse keeper."),),
        max_tokens=128,
    )
    await llm.complete(request)  # warm-up: model load, caches
    started = time.perf_counter()
    response = await llm.complete(request)
    elapsed = time.perf_counter() - started
    return (response.usage.completion_tokens if response.usage else 0) / elapsed


async def measure(label: str, llm: LLM, debates: int, word_limit: int) -> Figures:
    tps = await generation_speed(llm)
    debate = build_debate(llm, word_limit)
    evaluated_before = llm.stats.evaluated if isinstance(llm, LocalLLM) else 0
    seconds: list[float] = []
    completion = total = calls = 0
    for _ in range(debates):
        started = time.perf_counter()
        result = await debate.run(TOPIC)
        seconds.append(time.perf_counter() - started)
        if not result.ok:
            print(f"  ({label}: a debate failed: {result.error})", file=sys.stderr)
        completion += result.token_usage.completion_tokens
        total += result.token_usage.total_tokens
        calls += result.calls
    evaluated = llm.stats.evaluated - evaluated_before if isinstance(llm, LocalLLM) else None
    return Figures(label, seconds, completion, total, calls, tps, evaluated)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def llama_server(model: Path, threads: int, *options: str) -> Iterator[str]:
    """``python -m llama_cpp.server`` on a free port (with the server's command-line ``options``);
    yields its base URL, stops it afterwards."""
    port = _free_port()
    log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(threads),
        *options,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_ready(base_url, proc, log)
        yield base_url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


def _wait_ready(base_url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"llama_cpp.server exited: {log.read_text(errors='replace')[-2000:]}"
            )
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{base_url}/models", timeout=2):
            return
        time.sleep(0.25)
    raise TimeoutError("llama_cpp.server did not become ready in 180 s")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--debates", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--word-limit", type=int, default=60)
    args = parser.parse_args()
    model = default_model_path()
    print(
        f"model {model.name}, {args.threads} threads, max_tokens {MAX_TOKENS}, "
        f"word limit {args.word_limit or 'none'}, {os.cpu_count()} CPUs"
    )
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}\n")

    local = LocalLLM(model, n_threads=args.threads, max_tokens=MAX_TOKENS, seed=1)
    results = [await measure("in-process (LocalLLM)", local, args.debates, args.word_limit)]
    del local  # free the in-process model before the server loads its own copy

    with llama_server(model, args.threads) as base_url:
        remote = OpenAICompatibleLLM(
            "smollm2", base_url=base_url, max_tokens=MAX_TOKENS, timeout=300
        )
        results.append(
            await measure(
                "llama_cpp.server (OpenAICompatibleLLM)", remote, args.debates, args.word_limit
            )
        )
        await remote.aclose()

    for figures in results:
        print("\n".join(figures.lines()))
    print(f"\nload average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    asyncio.run(main())
