"""What a debate costs with and without prompt caching, under each provider's documented rules.

Fixed round-robin debates (a moderator who frames and writes the synthesis, a judge after every
round who never calls consensus, so every round is played) run through the real providers
(``AnthropicLLM``, ``OpenAICompatibleLLM``) against local fake endpoints that apply Anthropic's
and OpenAI's caching rules and bill as they would (``tests/support/caching.py``: minimum prefix,
breakpoints and their 20-block lookback, 5-minute TTL, 128-token steps). Answers are fixed
pseudo-random prose: turns of 150–300 tokens, a framing of ~100, a synthesis of ~250.

Shapes: 3 participants × 3 rounds, and 5 × 4. For each provider's rules it prints the prompt
tokens, what was read from and written to the cache, and the billed input cost with caching
against the same prompts billed without it; output costs the same either way.

Run: ``python benchmarks/cost.py``. Goal: the 5×4 debate's billed input cost with caching is at
most 40% of the uncached cost on Anthropic's rules and at most 60% on OpenAI's.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.caching import (
    AnthropicCache,
    CachingAPI,
    OpenAICache,
    Usage,
    tokens,
)

from debatebus import Debate, Judge, Participant
from debatebus._pricing import DEFAULT_PRICES, Price
from debatebus.llm._anthropic_llm import AnthropicLLM, min_cacheable_tokens
from debatebus.llm._openai_compat import OpenAICompatibleLLM

GOALS = {"anthropic": 0.40, "openai": 0.60}
QUESTION = ("Should a mid-sized city replace its diesel bus fleet with battery-electric buses "
            "by 2030, given its budget, its grid and its riders?")
PANEL = [
    Participant("planner", "You are the city's transport planner. You care about service "
                "coverage, reliability and the timetable riders depend on, and you know what the "
                "depots, routes and drivers can absorb in a year."),
    Participant("treasurer", "You are the city's treasurer. You weigh up-front capital against "
                "running costs over the vehicles' life, grants that may or may not come, and "
                "the debt the city already carries."),
    Participant("engineer", "You are the utility's grid engineer. You know what charging a "
                "fleet overnight does to local substations, what upgrades take and how long "
                "they wait in the queue."),
    Participant("rider", "You speak for the riders: people who need buses that come on time, "
                "are warm in winter, reach their jobs and cost what they can pay."),
    Participant("climate", "You are the city's climate officer. You count emissions and local "
                "air quality, and the commitments the council signed, year by year."),
]
MODERATOR = Participant("moderator", "You host debates neutrally: you frame the question, then "
                        "write a fair synthesis that credits each side.")
SHAPES = {"3×3": (3, 3), "5×4": (5, 4)}

_WORDS = (
    "budget", "grid", "depot", "charging", "route", "riders", "winter", "range", "battery",
    "diesel", "cost", "capital", "grant", "maintenance", "schedule", "service", "transit",
    "council", "emissions", "substation", "upgrade", "contract", "vendor", "timeline", "pilot",
    "fleet", "driver", "training", "reliability", "coverage", "fare", "subsidy", "loan", "risk",
    "evidence", "plan", "phase", "corridor", "demand", "peak", "overnight", "capacity",
    "warranty", "resale", "lifetime", "savings",
)
_GLUE = ("the", "a", "of", "to", "and", "in", "for", "with", "that", "this", "on", "by", "we",
         "our", "it", "is", "as", "more", "than")


def _prose(seed: str, low: int, high: int) -> str:
    """Sentences of plain words, ``low``–``high`` tokens long, the same for the same ``seed``."""
    rng = random.Random(hashlib.sha256(seed.encode()).digest())
    target = rng.randint(low, high)
    sentences: list[str] = []
    count = 0
    while count < target:
        words = [rng.choice(_WORDS if i % 2 else _GLUE) for i in range(rng.randint(8, 18))]
        sentence = " ".join(words).capitalize() + rng.choice([".", ".", ",", "."])
        sentences.append(sentence)
        count += len(tokens(" " + sentence))
    return " ".join(sentences).rstrip(",") + "."


def _user_text(body: dict[str, Any]) -> str:
    """The text of a request's last user message (a string, or Anthropic's text blocks)."""
    content = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    return content if isinstance(content, str) else "".join(b["text"] for b in content)


def answer(api: str, body: dict[str, Any]) -> str:
    """The fixed answer to a request: a verdict for the judge (whose prompt ends asking for JSON),
    prose for everyone else; the same on both APIs."""
    text = _user_text(body)
    seed = text[-400:] + str(len(text))
    if "JSON schema" in text:
        summary = _prose(seed, 25, 35).replace('"', "")
        return f'{{"consensus": false, "summary": "{summary}"}}'
    if "Frame this debate" in text:
        return _prose(seed, 90, 110)
    if "synthesis" in text.split("---")[-1]:
        return _prose(seed, 230, 270)
    return _prose(seed, 150, 300)


@dataclass
class Bill:
    calls: int
    prompt: int
    read: int
    written: int
    output: int

    def input_cost(self, price: Price, *, cached: bool) -> float:
        if not cached:
            return self.prompt * price.input / 1e6
        uncached = self.prompt - self.read - self.written
        return (uncached * price.input + self.read * price.cached_input
                + self.written * price.cache_write) / 1e6


def _debate(llm: Any, shape: str) -> Debate:
    participants, rounds = SHAPES[shape]
    return Debate(f"cost-{shape}", PANEL[:participants], llm=llm, moderator=MODERATOR,
                  judge=Judge(), max_rounds=rounds, prices=DEFAULT_PRICES)


async def _run(api: CachingAPI, kind: str, model: str, shape: str) -> tuple[Bill, Any]:
    llm: Any
    if kind == "anthropic":
        llm = AnthropicLLM(model, base_url=api.url, api_key="bench")
    else:
        llm = OpenAICompatibleLLM(model, base_url=f"{api.url}/v1", api_key="bench",
                                  send_prompt_cache_key=True)
    try:
        result = await _debate(llm, shape).run(QUESTION, debate_id=f"{kind}-{model}-{shape}")
    finally:
        await llm.aclose()
    if not result.ok:
        raise SystemExit(f"{kind} {model} {shape}: the debate failed: {result.error}")
    billed: list[Usage] = api.billed
    usage = result.token_usage
    bill = Bill(len(billed), sum(u.prompt for u in billed), sum(u.cache_read for u in billed),
                sum(u.cache_write for u in billed), usage.completion_tokens)
    # debatebus counted what the server billed, token for token.
    assert (bill.prompt, bill.read, bill.written) == (
        usage.prompt_tokens, usage.cache_read_tokens, usage.cache_write_tokens), (bill, usage)
    return bill, result.cost


def _row(kind: str, model: str, shape: str, bill: Bill, price: Price) -> tuple[str, float]:
    plain = bill.input_cost(price, cached=False)
    cached = bill.input_cost(price, cached=True)
    output = bill.output * price.output / 1e6
    ratio = cached / plain
    line = (f"| {kind} ({model}) | {shape} | {bill.calls} | {bill.prompt:,} | {bill.read:,} | "
            f"{bill.written:,} | ${plain:.4f} | ${cached:.4f} | **{ratio:.0%}** | "
            f"${plain + output:.4f} → ${cached + output:.4f} |")
    return line, ratio


async def main(args: argparse.Namespace) -> int:
    runs = [("anthropic", model) for model in args.anthropic] + [("openai", args.openai)]
    print("| rules (model) | debate | calls | prompt tokens | cache reads | cache writes | "
          "input, uncached | input, cached | cached / uncached | total (with output) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    verdicts = []
    for kind, model in runs:
        for shape in SHAPES:
            api = CachingAPI(answer, anthropic=AnthropicCache(
                min_tokens=min_cacheable_tokens(model)), openai=OpenAICache()).start()
            try:
                bill, cost = await _run(api, kind, model, shape)
            finally:
                api.stop()
            prices = [model] if kind == "anthropic" else args.openai_prices
            for priced in prices:
                price = DEFAULT_PRICES.price_of(priced)
                assert price is not None, priced
                line, ratio = _row(kind, priced, shape, bill, price)
                print(line)
                if shape == "5×4":
                    verdicts.append((kind, priced, ratio))
            if kind == "anthropic":
                assert cost is not None and abs(
                    cost.total - (bill.input_cost(DEFAULT_PRICES.models[model], cached=True)
                                  + bill.output * DEFAULT_PRICES.models[model].output / 1e6)
                ) < 1e-6, cost  # the result's debateCost is the server's bill
    print()
    for kind, model, ratio in verdicts:
        goal = GOALS[kind]
        met = "met" if ratio <= goal else "NOT met"
        print(f"5×4 on {kind}'s rules ({model}): cached input cost {ratio:.0%} of uncached, "
              f"goal ≤ {goal:.0%}: {met}")
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--anthropic", nargs="+", default=["claude-sonnet-4-5", "claude-haiku-4-5"],
                        help="Claude models whose rules (minimum prefix) and prices to apply")
    parser.add_argument("--openai", default="gpt-4.1-mini", help="the model name sent")
    parser.add_argument("--openai-prices", nargs="+",
                        default=["gpt-4o-mini", "gpt-4.1-mini", "gpt-5-mini"],
                        help="OpenAI models whose prices (cache discounts) to apply")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
