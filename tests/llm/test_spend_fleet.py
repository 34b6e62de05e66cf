"""One Redis spend limit shared by 3 worker processes: together they spend up to the limit and
then stop, and what they spent in all stays within one debate's cost of it (the calls in flight
when it is reached still complete: one per process here)."""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from typing import Any

import pytest

from debatebus import Debate, Participant
from debatebus._pricing import Price, Prices
from debatebus._usage import TokenUsage
from debatebus.llm import LLMRequest, LLMResponse, SpendLimit, SpendLimitedLLM
from debatebus.llm._ratelimit_redis import RedisSpendLimiter
from debatebus.testing import FunctionLLM

PROCESSES = 3
PRICES = Prices({"talker": Price(3.0, 0.3, 3.75, 15.0)})
USAGE = TokenUsage.of(1000, 100, cache_read_tokens=400)  # 0.00402 a call
PANEL = ("ann", "bob", "cyd")
ROUNDS = 2
DEBATE_COST = len(PANEL) * ROUNDS * PRICES.models["talker"].cost(USAGE)


async def _answer(request: LLMRequest) -> LLMResponse:
    await asyncio.sleep(0)  # the processes' calls interleave on Redis
    return LLMResponse("A point.", None, USAGE, "talker")


async def _debates(url: str, name: str, limit: SpendLimit, index: int) -> tuple[int, float, str]:
    """Run debates one after another until the spend limit stops one: how many ran, what they
    cost in all, and how the last one ended."""
    limiter = RedisSpendLimiter(url, name, limit)
    llm = SpendLimitedLLM(FunctionLLM(_answer, model="talker"), limiter, PRICES)
    debate = Debate("fleet", [Participant(n, f"{n}.") for n in PANEL], llm=llm,
                    max_rounds=ROUNDS, prices=PRICES)
    spent, count = 0.0, 0
    try:
        while True:
            result = await debate.run("Tabs?", debate_id=f"{index}-{count}")
            count += 1
            assert result.cost is not None
            spent += result.cost.total
            if not result.ok:
                return count, spent, str(result.stop_reason)
    finally:
        await limiter.close()


def _worker(args: tuple[str, str, SpendLimit, int], barrier: Any, out: Any) -> None:
    barrier.wait()  # every process starts spending at once
    out.put(asyncio.run(_debates(*args)))


@pytest.mark.redis
def test_three_processes_share_one_spend_limit(redis_server: Any) -> None:
    name = f"spend-{uuid.uuid4().hex[:8]}"
    # A window of ~32 years: no boundary falls within the test (windows are aligned on the epoch).
    limit = SpendLimit(max_cost=40 * DEBATE_COST, window_s=1e9)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=((redis_server.url, name, limit, i), barrier, out))
             for i in range(PROCESSES)]
    for proc in procs:
        proc.start()
    ended = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    assert [reason for _, _, reason in ended] == ["spend_limit"] * PROCESSES
    assert all(count > 1 for count, _, _ in ended)  # each process took its share
    total = sum(spent for _, spent, _ in ended)
    assert limit.max_cost <= total <= limit.max_cost + DEBATE_COST
    # What the fleet spent is what Redis counted against the limit.
    assert asyncio.run(_window_spent(redis_server.url, name, limit)) == pytest.approx(total)


async def _window_spent(url: str, name: str, limit: SpendLimit) -> float:
    limiter = RedisSpendLimiter(url, name, limit)
    try:
        return (await limiter.window()).spent
    finally:
        await limiter.close()
