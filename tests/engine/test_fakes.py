"""The shipped fakes: deterministic answers and usage, clear exhaustion, failures with usage."""

from __future__ import annotations

import pytest

from debatebus.engine import Verdict
from debatebus.exceptions import LLMResponseError, ScriptExhaustedError
from debatebus.llm import LLMRequest, LLMResponse, Message, TokenUsage
from debatebus.llm._fakes import word_usage
from debatebus.testing import FunctionLLM, ScriptedLLM


def request(prompt: str = "say something now", schema=None, **kw) -> LLMRequest:
    return LLMRequest("be brief", (Message("user", prompt),), schema, None, **kw)


def test_fakes_are_not_collected_as_tests():
    assert ScriptedLLM.__test__ is False
    assert FunctionLLM.__test__ is False


def test_word_usage_counts_whitespace_words_of_system_messages_and_answer():
    req = LLMRequest("a b", (Message("user", "c d e"), Message("assistant", "f")))
    assert word_usage(req, "x y") == TokenUsage(6, 2, 8)
    assert req.prompt == "c d e"


async def test_scripted_llm_plays_each_kind_of_entry_in_order():
    prebuilt = LLMResponse("prebuilt", None, TokenUsage.of(1, 1), "other")
    llm = ScriptedLLM(
        [
            "plain text",
            {"consensus": True, "summary": "ok"},
            lambda r: f"echo {r.prompt}",
            prebuilt,
            ValueError("scripted failure"),
        ],
        model="script-1",
    )
    text = await llm.complete(request())
    assert (text.text, text.structured, text.model) == ("plain text", None, "script-1")
    assert text.usage == word_usage(request(), "plain text")
    verdict = await llm.complete(request(schema=Verdict))
    assert verdict.structured == Verdict(consensus=True, summary="ok")
    assert (await llm.complete(request("hi"))).text == "echo hi"
    assert await llm.complete(request()) is prebuilt
    with pytest.raises(ValueError, match="scripted failure"):
        await llm.complete(request())
    assert llm.remaining == 0
    assert len(llm.requests) == 5


async def test_scripted_llm_async_callable_entry():
    async def reply(req: LLMRequest) -> str:
        return req.speaker

    llm = ScriptedLLM([reply])
    assert (await llm.complete(request(speaker="zoe"))).text == "zoe"


async def test_scripted_llm_exhaustion_names_the_call():
    llm = ScriptedLLM(["only"], model="tiny")
    await llm.complete(request())
    with pytest.raises(ScriptExhaustedError) as caught:
        await llm.complete(request(speaker="bob", purpose="rebuttal", round=2))
    assert str(caught.value) == (
        "tiny: call 2 (rebuttal by bob, round 2) has no scripted response; the script holds 1"
    )


async def test_json_text_for_a_schema_is_parsed_and_validated():
    llm = ScriptedLLM(['{"consensus": false, "summary": "no"}'])
    response = await llm.complete(request(schema=Verdict))
    assert response.structured == Verdict(consensus=False, summary="no")


async def test_structured_output_that_does_not_validate_raises_with_usage():
    llm = ScriptedLLM([{"summary": "missing consensus"}])
    req = request(schema=Verdict)
    with pytest.raises(LLMResponseError, match="does not validate as Verdict") as caught:
        await llm.complete(req)
    assert caught.value.usage == word_usage(req, '{"summary": "missing consensus"}')


async def test_invalid_json_for_a_schema_raises_llm_response_error_with_usage():
    llm = ScriptedLLM(["{not json at all"])
    req = request(schema=Verdict)
    with pytest.raises(LLMResponseError, match="is not valid JSON") as caught:
        await llm.complete(req)
    assert caught.value.usage == word_usage(req, "{not json at all")


async def test_function_llm_sync_and_async():
    def sync(req: LLMRequest) -> str:
        return req.prompt.upper()

    async def asynchronous(req: LLMRequest) -> dict[str, object]:
        return {"consensus": True, "summary": req.prompt}

    assert (await FunctionLLM(sync).complete(request("abc"))).text == "ABC"
    llm = FunctionLLM(asynchronous, model="fn-2")
    response = await llm.complete(request("why", schema=Verdict))
    assert response.structured == Verdict(consensus=True, summary="why")
    assert response.model == llm.model == "fn-2"
    assert [r.prompt for r in llm.requests] == ["why"]


async def test_function_llm_returning_an_unknown_type_is_a_type_error():
    with pytest.raises(TypeError, match="cannot turn int into a response"):
        await FunctionLLM(lambda r: 42).complete(request())
