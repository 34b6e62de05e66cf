"""Evaluations of scripted models whose right answers are known (tests/evaluation/world.py): the
table worked out by hand, compute matching, resume after a kill, and the same table twice."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from tests.evaluation.world import DATASET, answer, judged_debate, world_debate, world_llm

from debatebus._pricing import Price, Prices
from debatebus.evaluation import (
    Ask,
    DebateArm,
    Evaluation,
    HandlerArm,
    NumericGrader,
    Report,
    Single,
    Vote,
    arithmetic,
    majority,
    wilson_interval,
)
from debatebus.exceptions import ConfigError, LLMError
from debatebus.llm import LLMRequest, LLMResponse
from debatebus.llm._base import model_name
from debatebus.testing import FunctionLLM, ScriptedLLM

LATENCY = ("latency_p50_s", "latency_p95_s")


def world_arms(llm: Any = None) -> list[Any]:
    llm = llm or world_llm()
    return [Single(llm), Vote(llm, matched_to="debate"),
            DebateArm(world_debate(llm), name="debate", final="majority")]


def without_latency(report: Report) -> list[dict[str, Any]]:
    return [{k: v for k, v in arm.items() if k not in LATENCY}
            for arm in report.to_dict()["arms"]]


async def test_a_debate_that_fixes_wrong_answers_scores_higher_as_worked_out_by_hand() -> None:
    report = await Evaluation(DATASET, world_arms()).run()
    single, vote, debate = (report.arm(n) for n in ("single", "vote", "debate"))
    assert (single.correct, vote.correct, debate.correct) == (3, 8, 10)
    assert single.interval.low == pytest.approx(0.1078, abs=5e-5)
    assert single.interval.high == pytest.approx(0.6032, abs=5e-5)
    assert debate.interval == wilson_interval(10, 10)
    assert debate.interval.low == pytest.approx(0.7225, abs=5e-5)
    # Paired: the debate alone is right on items 3–9 against single (7 to 0: p = 2/2^7), on
    # items 8–9 against the vote (2 to 0: p = 2/2^2); the vote on 3–7 against single.
    assert debate.vs_single is not None and debate.vs_vote is not None
    assert (debate.vs_single.wins, debate.vs_single.losses) == (7, 0)
    assert debate.vs_single.p_value == pytest.approx(0.015625)
    assert (debate.vs_vote.wins, debate.vs_vote.losses) == (2, 0)
    assert debate.vs_vote.p_value == pytest.approx(0.5)
    assert vote.vs_single is not None and (vote.vs_single.wins, vote.vs_single.losses) == (5, 0)
    assert vote.vs_single.p_value == pytest.approx(0.0625)
    assert single.vs_single is None and vote.vs_vote is None
    # What each spent: one call; 3 solvers × 2 rounds; as many samples as the debate's calls.
    assert (single.calls, debate.calls, vote.calls) == (1, 6, 6)
    assert debate.satisfied == 0 and single.satisfied is None
    assert report.config["arms"]["vote"]["matchedTo"] == "debate"
    assert report.config["models"] == {} and report.config["dataset"]["items"] == 10


async def test_the_vote_takes_the_majority_of_its_samples() -> None:
    report = await Evaluation(DATASET, [Vote(world_llm(), k=6)]).run()
    results = report.results["vote"]
    right = [int(item.reference) for item in DATASET.items]
    # Four right samples out of six on items 0–7; all six wrong on 8 and 9.
    assert [r.answer for r in results[:8]] == [
        f"Working it out step by step, so the answer is {v:,}." for v in right[:8]]
    assert [r.correct for r in results] == [True] * 8 + [False] * 2
    grader = NumericGrader()
    assert majority(["It is 7.", "It is 5.", "so 7", "no idea"], grader) == "It is 7."
    assert majority(["It is 5.", "It is 7."], grader) == "It is 5."  # a tie: the first value
    assert majority(["no idea", "none"], grader) == "no idea"


def vote_and_debate(report: Report) -> list[tuple[int, int, int, int]]:
    """Per item: the debate's and the vote's calls, then their total tokens."""
    return [(d.calls or 0, v.calls or 0, (d.prompt_tokens or 0) + (d.completion_tokens or 0),
             (v.prompt_tokens or 0) + (v.completion_tokens or 0))
            for d, v in zip(report.results["judged"], report.results["vote"], strict=True)]


async def test_the_vote_matches_the_debates_calls_item_by_item() -> None:
    llm = world_llm()
    arms = [DebateArm(judged_debate(llm), name="judged"), Vote(llm, matched_to="judged")]
    report = await Evaluation(DATASET, arms).run()
    rows = vote_and_debate(report)
    # A judge that agrees after round 1 on even items: 3 turns and a ruling; else 3 rounds.
    assert [debate for debate, *_ in rows] == [4, 12] * 5
    assert all(vote == debate for debate, vote, *_ in rows)
    assert report.arm("vote").calls == report.arm("judged").calls == 8
    assert report.arm("judged").satisfied == 5


async def test_the_vote_matches_the_debates_tokens_within_one_sample() -> None:
    llm = world_llm()
    arms = [DebateArm(judged_debate(llm), name="judged"),
            Vote(llm, matched_to="judged", match="tokens")]
    report = await Evaluation(DATASET, arms).run()
    for debate_calls, samples, debate_tokens, vote_tokens in vote_and_debate(report):
        per_sample = vote_tokens / samples  # the world's samples all cost the same
        assert vote_tokens >= debate_tokens > vote_tokens - per_sample
        assert samples == math.ceil(debate_tokens / per_sample) > debate_calls


async def test_a_vote_matched_on_tokens_stops_at_a_sample_of_unknown_cost() -> None:
    async def handler(payload: dict[str, Any]) -> dict[str, Any]:
        return {"debateOutput": "5", "debateCalls": 3,
                "debateTokenUsage": {"promptTokens": 90, "completionTokens": 10,
                                     "totalTokens": 100}}

    silent = FunctionLLM(lambda request: LLMResponse("It is 5.", usage=None))
    arms = [HandlerArm(handler, name="h"), Vote(silent, matched_to="h", match="tokens")]
    report = await Evaluation(arithmetic(2, seed=3), arms).run()
    assert report.arm("vote").calls == 1  # not a loop that never reaches 100 tokens


class Killed(BaseException):
    """Like a KeyboardInterrupt: nothing in the engine catches it."""


def counting(after: int | None = None) -> FunctionLLM:
    """The world's model; with ``after``, killed at that call."""

    def killing(request: LLMRequest) -> Any:
        if after is not None and len(llm.requests) >= after:
            raise Killed
        return answer(request)

    llm = FunctionLLM(killing, model="world")
    return llm


async def test_an_evaluation_killed_halfway_resumes_without_asking_again(tmp_path: Path) -> None:
    results = tmp_path / "items.jsonl"
    clean = counting()
    expected = await Evaluation(DATASET, world_arms(clean)).run()

    # 13 calls an item (single, the debate's 6, the vote's 6): killed at item 5's vote.
    first = counting(after=60)
    with pytest.raises(Killed):
        await Evaluation(DATASET, world_arms(first)).run(results)
    stored = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    assert [(r["item"], r["arm"]) for r in stored[-2:]] == [
        (DATASET.items[4].id, "single"), (DATASET.items[4].id, "debate")]
    assert len(stored) == 4 * 3 + 2
    paid = sum(r["calls"] for r in stored)

    second = counting()
    report = await Evaluation(DATASET, world_arms(second)).run(results)
    assert len(second.requests) == len(clean.requests) - paid  # nothing stored is asked again
    assert without_latency(report) == without_latency(expected)
    assert report.config["runId"] == json.loads(results.read_text().splitlines()[0])["runId"]

    third = counting()
    await Evaluation(DATASET, world_arms(third)).run(results)
    assert third.requests == []  # all stored


async def test_a_results_line_cut_by_a_kill_is_asked_again(tmp_path: Path) -> None:
    results = tmp_path / "items.jsonl"
    dataset = arithmetic(2, seed=3)
    llm = ScriptedLLM(["It is 1."] * 2)
    await Evaluation(dataset, [Single(llm)]).run(results)
    whole = results.read_text()
    results.write_text(whole[: whole.rindex("{") + 20])  # the last result half written
    again = ScriptedLLM(["It is 1."])
    report = await Evaluation(dataset, [Single(again)]).run(results)
    assert len(again.requests) == 1 and len(report.results["single"]) == 2
    assert results.read_text().count("\n") == 3 and results.read_text().endswith("\n")


async def test_results_of_another_evaluation_are_refused_unless_fresh(tmp_path: Path) -> None:
    results = tmp_path / "items.jsonl"
    await Evaluation(arithmetic(2, seed=3), [Single(ScriptedLLM(["1"] * 2))]).run(results)
    other = Evaluation(arithmetic(2, seed=4), [Single(ScriptedLLM(["1"] * 2))])
    with pytest.raises(ConfigError, match=r"holds the results of another evaluation.*--fresh"):
        await other.run(results)
    report = await other.run(results, fresh=True)
    assert [r.item for r in report.results["single"]] == [i.id for i in other.dataset.items]
    (tmp_path / "notes.jsonl").write_text("hello\n")
    with pytest.raises(ConfigError, match="is not a debatebus evaluation's results file"):
        await other.run(tmp_path / "notes.jsonl")


async def test_the_same_evaluation_twice_gives_the_same_table(tmp_path: Path) -> None:
    reports = [await Evaluation(DATASET, world_arms(), seed=5, bootstrap=500).run(
        tmp_path / f"run{i}.jsonl") for i in range(2)]
    first, second = ([row[:-3] + row[-1:] for row in r.rows()] for r in reports)  # not latency
    assert first == second
    assert without_latency(reports[0]) != [] and {
        **reports[0].to_dict()["config"], "runId": ""} == {
        **reports[1].to_dict()["config"], "runId": ""}
    assert without_latency(reports[0]) == without_latency(reports[1])
    debate = reports[0].arm("debate")
    assert debate.vs_single is not None and debate.vs_single.bootstrap is not None
    assert debate.vs_single.bootstrap.low <= 0.7 <= debate.vs_single.bootstrap.high


async def test_a_failed_answer_counts_as_wrong_and_is_shown(tmp_path: Path) -> None:
    # Item 1: the single call fails, the vote's sample answers; item 2: the other way round.
    llm = ScriptedLLM([LLMError("provider down"), "So 999.", "So 999.", LLMError("down")])
    report = await Evaluation(arithmetic(2, seed=3), [Single(llm, name="single"),
                                                      Vote(llm, k=1)]).run()
    single, vote = report.arm("single"), report.arm("vote")
    assert (single.failed, vote.failed) == (1, 1)
    assert report.results["single"][0].error == "provider down"
    assert not any(r.correct for rs in report.results.values() for r in rs)


async def test_a_handler_arm_reads_the_result_document() -> None:
    async def handler(payload: dict[str, Any]) -> dict[str, Any]:
        return {"debateOutput": payload["input"].split(" ")[5].rstrip("?"),
                "debateTokenUsage": {"promptTokens": 3, "completionTokens": 2,
                                     "totalTokens": 5},
                "debateCalls": 2, "debateCost": {"total": 0.25}}

    dataset = arithmetic(3, seed=3)
    report = await Evaluation(dataset, [HandlerArm(handler, name="mine")]).run()
    arm = report.arm("mine")
    assert (arm.calls, arm.prompt_tokens, arm.completion_tokens, arm.cost) == (2, 3, 2, 0.75)
    assert report.config["arms"]["mine"]["handler"].endswith("handler")


async def test_a_vote_cannot_match_what_a_result_does_not_say() -> None:
    async def handler(payload: dict[str, Any]) -> dict[str, Any]:
        return {"debateOutput": "42"}

    arms = [HandlerArm(handler, name="bare"), Vote(world_llm(), matched_to="bare")]
    with pytest.raises(ConfigError, match=r"no debateCalls.*give the vote a fixed k"):
        await Evaluation(DATASET, arms).run()
    with pytest.raises(ConfigError, match=r"cannot read.*at least debateOutput"):
        await HandlerArm(lambda p: _async({"output": 1}), name="x").answer(
            Ask("q", "k", NumericGrader()))


async def _async(value: Any) -> Any:
    return value


def test_arms_are_checked_when_the_evaluation_is_made() -> None:
    llm = world_llm()
    with pytest.raises(ConfigError, match=r"arm names must differ: \['single'\]"):
        Evaluation(DATASET, [Single(llm), Single(llm)])
    with pytest.raises(ConfigError, match="matched to 'debate', which is not one of the arms"):
        Evaluation(DATASET, [Vote(llm, matched_to="debate")])
    with pytest.raises(ConfigError, match=r"either k= .* or matched_to="):
        Vote(llm)
    with pytest.raises(ConfigError, match="needs at least one arm"):
        Evaluation(DATASET, [])


async def test_the_report_is_written_as_json_markdown_and_svg(tmp_path: Path) -> None:
    report = await Evaluation(DATASET, world_arms(), models={"llm": "world"}).run()
    written = report.write(tmp_path)
    document = json.loads(written["json"].read_text())
    assert [arm["name"] for arm in document["arms"]] == ["single", "vote", "debate"]
    assert document["arms"][2]["interval"]["low"] == pytest.approx(0.7225, abs=5e-5)
    assert document["config"]["models"] == {"llm": "world"}
    markdown = written["markdown"].read_text()
    assert "| debate | 100.0% | 72.2%–100.0% | +7/−0 p=0.0156 |" in markdown
    svg = ElementTree.parse(written["svg"]).getroot()
    circles = svg.findall(".//{http://www.w3.org/2000/svg}circle")
    assert [c.get("data-arm") for c in circles] == ["single", "vote", "debate"]
    # Accuracy is up: the debate (100%) is drawn above the single call (30%).
    heights = {c.get("data-arm"): float(c.get("cy", "0")) for c in circles}
    assert heights["debate"] < heights["vote"] < heights["single"]
    table = report.table()
    assert table.splitlines()[0].split()[:3] == ["arm", "accuracy", "95%"]


async def test_with_prices_each_arm_says_what_it_cost() -> None:
    """Cost per arm: single and vote priced from their usage, computed by hand here; an arm
    without prices says nothing rather than guess."""
    llm = world_llm()
    prices = Prices({model_name(llm): Price(input=2.0, cached_input=0.2, cache_write=2.5,
                                            output=8.0)})
    report = await Evaluation(DATASET, [Single(llm, prices=prices), Vote(llm, k=3, prices=prices),
                                        Single(llm, name="unpriced")]).run()
    summaries = {s.name: s for s in report.arms}
    for arm in ("single", "vote"):
        summary = summaries[arm]
        usage_cost = sum(((r.prompt_tokens or 0) * 2.0 + (r.completion_tokens or 0) * 8.0) / 1e6
                         for r in report.results[arm])
        assert summary.cost is not None and math.isclose(summary.cost, usage_cost), arm
        assert summary.cost > 0
    assert summaries["unpriced"].cost is None
