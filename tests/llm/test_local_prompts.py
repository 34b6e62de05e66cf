"""The embedded model under the debate's prompts: prefix reuse, stop sequences, grammar verdicts.

Shape and counters only, never wording: the model's text is sampled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from debatebus import Debate, Judge, Participant
from debatebus.engine import Verdict
from debatebus.llm import LLMRequest, LLMResponse, Message
from debatebus.testing import FunctionLLM, ScriptedLLM
from tests.support.llm import HAVE_LLAMA, NO_LLAMA

pytestmark = [pytest.mark.local_llm, pytest.mark.skipif(not HAVE_LLAMA, reason=NO_LLAMA)]

if HAVE_LLAMA:
    from debatebus.llm._local import LocalLLM

QUESTIONS = (
    "Should a 5-person startup adopt microservices?",
    "Should cities ban cars from their centres?",
    "Is remote work better for software teams?",
    "Should schools teach programming from age seven?",
    "Should a library replace its printed books with e-books?",
)


@pytest.fixture(scope="module")
def local_llm(model_path: Path) -> LocalLLM:
    return LocalLLM(model_path, seed=7, n_threads=2)


def people() -> list[Participant]:
    return [
        Participant("optimist", "You argue for the proposal. Be brief."),
        Participant("critic", "You argue against the proposal. Be brief."),
        Participant("pragmatist", "You look for the middle ground. Be brief."),
    ]


async def test_the_second_speaker_of_a_round_reuses_the_shared_prefix(local_llm: LocalLLM) -> None:
    seen: dict[tuple[str, int], tuple[int, int]] = {}

    async def counted(request: LLMRequest) -> LLMResponse:
        response = await local_llm.complete(request)
        seen[(request.speaker, request.round)] = (
            local_llm.stats.last_prompt_tokens,
            local_llm.stats.last_evaluated,
        )
        return response

    limits = {"opening": 25, "rebuttal": 25}
    d = Debate("reuse", people(), llm=FunctionLLM(counted), word_limits=limits, max_rounds=2)
    result = await d.run(QUESTIONS[0])

    assert result.ok, result.error
    prompt_tokens, evaluated = seen[("critic", 2)]
    # Everything up to the optimist's round-2 turn (system prompt, topic, round 1) is reused.
    assert 0 < evaluated < prompt_tokens / 2, seen
    prompt_tokens, evaluated = seen[("critic", 1)]
    assert evaluated < prompt_tokens, seen


async def test_stop_sequences_end_the_answer(local_llm: LocalLLM) -> None:
    request = LLMRequest(
        "You are a storyteller.",
        (Message("user", "Tell a story about the sea and the wind."),),
        max_tokens=48,
        stop=("the", "The", "\n"),
    )
    response = await local_llm.complete(request)
    assert "the" not in response.text.lower()
    assert "\n" not in response.text


async def test_grammar_verdicts_parse_on_five_questions(local_llm: LocalLLM) -> None:
    calls_before = local_llm.stats.calls
    for question in QUESTIONS:
        debaters = ScriptedLLM(
            [
                f"Yes: {question.lower()} The benefits outweigh the costs.",
                "No. The risks are larger than they look and the costs come first.",
                "It depends on the team; start small and measure.",
            ]
        )
        d = Debate(
            "verdicts", people(), llm=debaters, judge=Judge(llm=local_llm), max_rounds=1
        )
        result = await d.run(question)

        assert result.ok, result.error
        verdict = result.rounds[0].verdict
        assert isinstance(verdict, Verdict)
        assert verdict.summary.strip()
    # One llama.cpp call per verdict: the grammar made every first answer valid, no repair.
    assert local_llm.stats.calls - calls_before == len(QUESTIONS)


async def test_a_grammar_verdict_is_bare_json(local_llm: LocalLLM) -> None:
    request = LLMRequest(
        "You judge debates.",
        (Message("user", "optimist: yes.\ncritic: no.\nDid they agree?"),),
        response_schema=Verdict,
    )
    response = await local_llm.complete(request)
    assert json.loads(response.text)["summary"]


def test_the_quality_benchmark_runs() -> None:
    script = Path(__file__).parents[2] / "benchmarks" / "local_quality.py"
    run = subprocess.run(
        [sys.executable, str(script), "--questions", "1", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=240,  # a bound on a hang, not a wait: about 30-60 s on two cores
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "debates whose verdicts all parsed : " in run.stdout
    assert "turns with another speaker's tag  : " in run.stdout
