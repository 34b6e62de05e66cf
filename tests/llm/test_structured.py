"""JSON extraction, validation and the one-repair loop, independent of any provider."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from debatebus._usage import TokenUsage
from debatebus.engine._rules import parse_verdict
from debatebus.exceptions import LLMRateLimitError, LLMResponseError
from debatebus.llm import LLMRequest, Message, ScriptedLLM
from debatebus.llm._structured import (
    Completion,
    InvalidStructuredOutput,
    complete_structured,
    extract_json_object,
    parse_structured,
    with_json_instructions,
)


class Verdict(BaseModel):
    consensus: bool
    summary: str


JUDGE = LLMRequest("Judge.", (Message("user", "t"),), response_schema=Verdict, purpose="verdict")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('Here: {"a": {"b": "}"}} trailing', {"a": {"b": "}"}}),
        ('```json\n{"a": [1, 2]}\n```', {"a": [1, 2]}),
        ('set {x} then {"a": 2}', {"a": 2}),  # the first *parsable* object
        ('{"a": "line one\nline two"}', {"a": "line one\nline two"}),  # raw newline in a string
        ("no braces", None),
        ('{"unterminated": ', None),
        ("[1, 2, 3]", None),
    ],
)
def test_extract_json_object(text: str, expected: dict[str, object] | None) -> None:
    assert extract_json_object(text) == expected


def test_parse_structured_explains_what_is_wrong() -> None:
    assert parse_structured('{"consensus": false, "summary": "s"}', Verdict) == Verdict(
        consensus=False, summary="s"
    )
    with pytest.raises(InvalidStructuredOutput, match="no JSON object"):
        parse_structured("prose", Verdict)
    with pytest.raises(InvalidStructuredOutput, match=r"summary: Field required"):
        parse_structured('{"consensus": true}', Verdict)


def test_instructions_carry_the_schema_at_the_end_of_the_prompt() -> None:
    """Not in the system prompt: the judge's system prompt and the prompt's shared prefix stay
    the debaters' (what prompt caches reuse); the breaks of the prompt stay where they were."""
    judge = LLMRequest("Judge.", (Message("user", "Transcript. Decide.", (11,)),))
    instructed = with_json_instructions(judge, Verdict)
    assert instructed.system == "Judge."
    [last] = instructed.messages
    assert last.content.startswith("Transcript. Decide.\n\nAnswer with")
    assert '"consensus"' in last.content
    assert last.breaks == (11,)
    [alone] = with_json_instructions(LLMRequest("", ()), Verdict).messages
    assert alone.content.startswith("Answer with")


class Script:
    """A ``send`` that answers from a list and records what it was asked."""

    def __init__(self, *answers: Completion | BaseException) -> None:
        self.answers = list(answers)
        self.requests: list[LLMRequest] = []

    async def __call__(self, request: LLMRequest) -> Completion:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


async def test_valid_first_answer_makes_one_call() -> None:
    send = Script(Completion('{"consensus": true, "summary": "s"}', TokenUsage.of(5, 2)))
    response = await complete_structured(JUDGE, send, model="m")
    assert response.structured == Verdict(consensus=True, summary="s")
    assert response.usage == TokenUsage.of(5, 2)
    assert len(send.requests) == 1


async def test_repair_request_replays_the_bad_answer() -> None:
    send = Script(
        Completion("", TokenUsage.of(5, 0)),
        Completion('{"consensus": false, "summary": "s"}', TokenUsage.of(9, 3)),
    )
    response = await complete_structured(JUDGE, send, model="m")
    assert response.usage == TokenUsage.of(14, 3)
    repair = send.requests[1]
    assert repair.messages[-2] == Message("assistant", "(empty answer)")
    assert repair.purpose == "verdict (repair)"
    assert repair.system == JUDGE.system


async def test_rate_limited_repair_keeps_the_tokens_already_spent() -> None:
    send = Script(Completion("bad", TokenUsage.of(5, 1)), LLMRateLimitError("m: 429"))
    with pytest.raises(LLMRateLimitError) as info:
        await complete_structured(JUDGE, send, model="m")
    assert info.value.usage == TokenUsage.of(5, 1)


async def test_error_text_is_redacted() -> None:
    send = Script(Completion("bad"), Completion("still bad sk-abcdefghijklmnop"))
    with pytest.raises(LLMResponseError) as info:
        await complete_structured(JUDGE, send, model="m", redact=lambda t: t.replace("sk-", "x-"))
    assert "sk-abcdefghijklmnop" not in str(info.value)


# ---- the one extractor, as the judge fallback and the fakes use it ---------------------------


@pytest.mark.parametrize(
    ("text", "summary"),
    [
        ('Ruling: {"consensus": true, "summary": "agreed"} done', "agreed"),
        # a greedy {.*} would swallow both objects and parse neither
        ('{"consensus": false, "summary": "first"} and later {"note": 1}', "first"),
        ('```json\n{"consensus": true, "summary": "fenced"}\n```', "fenced"),
    ],
)
def test_judge_text_fallback_uses_the_extractor(text: str, summary: str) -> None:
    verdict = parse_verdict(Verdict, text, "m")
    assert isinstance(verdict, Verdict)
    assert verdict.summary == summary


def test_judge_text_fallback_names_the_model_and_quotes_the_text() -> None:
    with pytest.raises(LLMResponseError, match=r"judge model 'm' did not return a valid Verdict: "
                                               r"'They mostly agree'"):
        parse_verdict(Verdict, "They mostly agree", "m")


async def test_scripted_json_text_goes_through_the_extractor() -> None:
    llm = ScriptedLLM(['{"consensus": false, "summary": "no"} (that is all)', "{not json"])
    response = await llm.complete(JUDGE)
    assert response.structured == Verdict(consensus=False, summary="no")
    with pytest.raises(LLMResponseError, match="is not valid JSON"):
        await llm.complete(JUDGE)
