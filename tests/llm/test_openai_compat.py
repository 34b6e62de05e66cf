"""OpenAICompatibleLLM against a real local HTTP server that misbehaves on request."""

from __future__ import annotations

import json
import sys
import time
import traceback
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from debatebus._usage import TokenUsage
from debatebus.exceptions import LLMError, LLMRateLimitError, LLMResponseError, LLMTimeoutError
from debatebus.llm import LLMRequest, Message
from debatebus.llm._openai_compat import OpenAICompatibleLLM, strict_json_schema
from debatebus.llm._retry import RetryPolicy
from tests.llm.servers import FakeAPI, Reply, chat_completion
from tests.support.llm import Sleeps
from tests.support.servers import free_port


class Verdict(BaseModel):
    consensus: bool
    summary: str
    winner: str | None = None


REQUEST = LLMRequest("You are terse.", (Message("user", "Say hi."),), speaker="a", purpose="turn")
JUDGE = LLMRequest(
    "You judge debates.", (Message("user", "a: yes\nb: yes"),), response_schema=Verdict
)
VALID = '{"consensus": true, "summary": "both agree", "winner": null}'


def make(
    api: FakeAPI,
    sleeps: Sleeps | None = None,
    *,
    timeout: float = 30.0,
    max_retries: int = 3,
    **kwargs: Any,
) -> OpenAICompatibleLLM:
    """A client of the fake API whose backoff sleeps are recorded, not waited."""
    policy = RetryPolicy(max_retries=max_retries, timeout=timeout, sleep=sleeps or Sleeps())
    return OpenAICompatibleLLM(
        "fake-model", base_url=f"{api.url}/v1", retry_policy=policy, **kwargs
    )


# --- plain completions -------------------------------------------------------------------------


async def test_completion_maps_text_usage_and_request_body(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(json=chat_completion("hello there", prompt_tokens=17, completion_tokens=2)))
    llm = make(fake_api, temperature=0.3, max_tokens=64)
    response = await llm.complete(REQUEST)
    assert response.text == "hello there"
    assert response.usage == TokenUsage(17, 2, 19)
    assert response.model == "fake-model"
    assert response.structured is None
    [sent] = fake_api.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.body["model"] == "fake-model"
    assert sent.body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hi."},
    ]
    assert sent.body["temperature"] == 0.3
    assert sent.body["max_tokens"] == 64  # not a paid host: the widely supported name
    assert "response_format" not in sent.body


async def test_request_max_tokens_overrides_the_default(fake_api: FakeAPI) -> None:
    llm = make(fake_api, max_tokens=64)
    await llm.complete(LLMRequest("s", (Message("user", "u"),), max_tokens=9))
    assert fake_api.requests[0].body["max_tokens"] == 9
    assert "temperature" not in fake_api.requests[0].body


# --- retries, Retry-After, timeouts --------------------------------------------------------------


async def test_429_with_retry_after_is_retried_after_the_given_delay(fake_api: FakeAPI) -> None:
    sleeps = Sleeps()
    fake_api.plan(Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "2"}))
    response = await make(fake_api, sleeps).complete(REQUEST)
    assert response.text == "ok"
    assert len(fake_api.requests) == 2
    assert sleeps.delays == [2.0]


async def test_retry_after_really_waits(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "1"}))
    llm = OpenAICompatibleLLM("fake-model", base_url=f"{fake_api.url}/v1", max_retries=1)
    started = time.monotonic()
    await llm.complete(REQUEST)
    assert time.monotonic() - started >= 0.95  # a lower bound only: waits never end early
    assert len(fake_api.requests) == 2


async def test_503_with_an_http_date_retry_after(fake_api: FakeAPI) -> None:
    sleeps = Sleeps()
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=5), usegmt=True)
    fake_api.plan(Reply(503, {"error": {"message": "overloaded"}}, headers={"Retry-After": when}))
    await make(fake_api, sleeps).complete(REQUEST)
    [delay] = sleeps.delays
    assert 3.0 <= delay <= 5.0  # the date has one-second resolution


async def test_persistent_rate_limit_becomes_llm_rate_limit_error(fake_api: FakeAPI) -> None:
    sleeps = Sleeps()
    fake_api.plan(*[Reply(429, {"error": {"message": "quota"}}) for _ in range(3)])
    with pytest.raises(LLMRateLimitError, match="fake-model: HTTP 429") as info:
        await make(fake_api, sleeps, max_retries=2).complete(REQUEST)
    assert isinstance(info.value.__cause__, openai.RateLimitError)
    assert "gave up after 3 attempts" in str(info.value)
    assert len(fake_api.requests) == 3
    assert len(sleeps.delays) == 2


async def test_server_errors_are_retried_then_succeed(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(500, {"error": {"message": "boom"}}), Reply(502, text="bad gateway"))
    assert (await make(fake_api).complete(REQUEST)).text == "ok"
    assert len(fake_api.requests) == 3


async def test_persistent_server_error_is_an_llm_error_with_the_sdk_cause(
    fake_api: FakeAPI,
) -> None:
    fake_api.plan(*[Reply(500, {"error": {"message": "boom"}}) for _ in range(2)])
    with pytest.raises(LLMError, match="HTTP 500 server error: boom") as info:
        await make(fake_api, max_retries=1).complete(REQUEST)
    assert isinstance(info.value.__cause__, openai.InternalServerError)


async def test_bad_request_is_not_retried(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(400, {"error": {"message": "unknown parameter"}}))
    with pytest.raises(LLMError, match="HTTP 400 request rejected: unknown parameter") as info:
        await make(fake_api).complete(REQUEST)
    assert isinstance(info.value.__cause__, openai.BadRequestError)
    assert len(fake_api.requests) == 1


async def test_slow_server_times_out_on_every_attempt(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(delay=30), Reply(delay=30))
    with pytest.raises(LLMTimeoutError) as info:
        await make(fake_api, timeout=0.5, max_retries=1).complete(REQUEST)
    assert isinstance(info.value.__cause__, openai.APITimeoutError | TimeoutError)
    assert len(fake_api.requests) == 2


async def test_unreachable_server_is_a_connection_error_after_retries() -> None:
    sleeps = Sleeps()
    llm = OpenAICompatibleLLM(
        "m",
        base_url=f"http://127.0.0.1:{free_port()}/v1",
        retry_policy=RetryPolicy(max_retries=2, timeout=10, sleep=sleeps),
    )
    with pytest.raises(LLMError, match="cannot reach") as info:
        await llm.complete(REQUEST)
    assert isinstance(info.value.__cause__, openai.APIConnectionError)
    assert len(sleeps.delays) == 2


@pytest.mark.parametrize(
    "reply",
    [
        Reply(text="this is not json"),
        Reply(json={"unexpected": 1}),
        Reply(json={"choices": []}),
        Reply(text="<html>oops</html>", content_type="text/html"),
    ],
    ids=["not-json", "no-choices", "empty-choices", "html"],
)
async def test_malformed_responses_are_response_errors(fake_api: FakeAPI, reply: Reply) -> None:
    fake_api.plan(reply)
    with pytest.raises(LLMResponseError, match="fake-model: malformed response"):
        await make(fake_api).complete(REQUEST)
    assert len(fake_api.requests) == 1


# --- structured output -------------------------------------------------------------------------


def _format_types(api: FakeAPI) -> list[str | None]:
    return [(body.get("response_format") or {}).get("type") for body in api.bodies()]


async def test_judge_gets_a_strict_json_schema_response_format(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(json=chat_completion(VALID)))
    response = await make(fake_api).complete(JUDGE)
    assert response.structured == Verdict(consensus=True, summary="both agree")
    [body] = fake_api.bodies()
    spec = body["response_format"]["json_schema"]
    assert spec["name"] == "Verdict"
    assert spec["strict"] is True
    assert spec["schema"]["additionalProperties"] is False
    assert spec["schema"]["required"] == ["consensus", "summary", "winner"]
    assert "consensus" in body["messages"][-1]["content"]  # the schema is in the prompt too


def test_strict_schema_is_refused_for_dict_fields() -> None:
    class Scores(BaseModel):
        scores: dict[str, float]

    assert strict_json_schema(Scores.model_json_schema()) is None


async def test_auto_steps_down_to_what_the_server_accepts_and_remembers(fake_api: FakeAPI) -> None:
    fake_api.plan(
        Reply(400, {"error": {"message": "response_format json_schema is not supported"}}),
        Reply(500, {"detail": "response_format.type: Input should be 'text'"}),
        Reply(json=chat_completion(VALID)),
        Reply(json=chat_completion(VALID)),
    )
    llm = make(fake_api)
    assert (await llm.complete(JUDGE)).structured is not None
    assert (await llm.complete(JUDGE)).structured is not None
    assert _format_types(fake_api) == ["json_schema", "json_object", None, None]


async def test_json_object_mode_sends_the_schema(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(json=chat_completion(VALID)))
    await make(fake_api, structured="json_object").complete(JUDGE)
    [body] = fake_api.bodies()
    assert body["response_format"] == {"type": "json_object", "schema": Verdict.model_json_schema()}


async def test_json_is_extracted_from_prose(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(json=chat_completion(f"Sure! Here it is:\n```json\n{VALID}\n```\nDone.")))
    response = await make(fake_api, structured="instructions").complete(JUDGE)
    assert response.structured == Verdict(consensus=True, summary="both agree")
    assert "response_format" not in fake_api.bodies()[0]


async def test_invalid_json_is_repaired_once(fake_api: FakeAPI) -> None:
    fake_api.plan(
        Reply(json=chat_completion("They mostly agree, I think.", 20, 7)),
        Reply(json=chat_completion(VALID, 40, 12)),
    )
    response = await make(fake_api).complete(JUDGE)
    assert response.structured == Verdict(consensus=True, summary="both agree")
    assert response.usage == TokenUsage(60, 19, 79)  # both attempts are counted
    repair = fake_api.bodies()[1]["messages"]
    assert repair[-2] == {"role": "assistant", "content": "They mostly agree, I think."}
    assert repair[-1]["role"] == "user"
    assert "no JSON object" in repair[-1]["content"]


async def test_a_second_invalid_answer_is_a_response_error_quoting_it(fake_api: FakeAPI) -> None:
    fake_api.plan(
        Reply(json=chat_completion('{"consensus": "perhaps"}', 20, 7)),
        Reply(json=chat_completion("I refuse to answer in JSON.", 40, 12)),
    )
    with pytest.raises(LLMResponseError) as info:
        await make(fake_api).complete(JUDGE)
    message = str(info.value)
    assert message.startswith("fake-model: no valid Verdict after one repair attempt")
    assert "raw text: 'I refuse to answer in JSON.'" in message
    assert info.value.usage == TokenUsage(60, 19, 79)
    first_fix = fake_api.bodies()[1]["messages"][-1]["content"]
    assert "consensus" in first_fix  # the validation error was sent back


async def test_long_raw_text_is_truncated_in_the_error(fake_api: FakeAPI) -> None:
    fake_api.plan(*[Reply(json=chat_completion("x" * 5000)) for _ in range(2)])
    with pytest.raises(LLMResponseError) as info:
        await make(fake_api).complete(JUDGE)
    assert len(str(info.value)) < 1000


async def test_failed_repair_call_still_reports_the_first_usage(fake_api: FakeAPI) -> None:
    fake_api.plan(
        Reply(json=chat_completion("nope", 20, 7)), Reply(400, {"error": {"message": "x"}})
    )
    with pytest.raises(LLMError) as info:
        await make(fake_api, structured="instructions").complete(JUDGE)
    assert info.value.usage == TokenUsage(20, 7, 27)


# --- secrets -----------------------------------------------------------------------------------


async def test_api_key_never_appears_in_errors_or_reprs(fake_api: FakeAPI) -> None:
    key = "sk-test-9f8e7d6c5b4a3210"
    echo = {"error": {"message": f"Incorrect API key provided: {key}.", "code": "invalid_api_key"}}
    fake_api.plan(Reply(401, echo))
    llm = OpenAICompatibleLLM("fake-model", base_url=f"{fake_api.url}/v1", api_key=key)
    with pytest.raises(LLMError) as info:
        await llm.complete(REQUEST)
    assert fake_api.requests[0].headers["authorization"] == f"Bearer {key}"  # it was sent…
    error = info.value
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None:
        chain.append(current)
        current = current.__cause__ or current.__context__
    assert isinstance(chain[1], openai.AuthenticationError)
    for text in [str(e) for e in chain] + ["".join(traceback.format_exception(error)), repr(llm)]:
        assert key not in text  # …but never shown
    assert "check the API key" in str(error)
    assert json.dumps(chain[1].body).count(key) == 0  # type: ignore[attr-defined]


def test_import_without_the_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)
    monkeypatch.delitem(sys.modules, "debatebus.llm._openai_compat", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'debatebus\[openai\]'"):
        import debatebus.llm._openai_compat  # noqa: F401


# --- a call is bounded as a whole ----------------------------------------------------------------


async def test_a_hanging_server_costs_one_total_timeout_not_every_attempt(
    fake_api: FakeAPI,
) -> None:
    fake_api.plan(*[Reply(delay=5.0) for _ in range(10)])
    llm = OpenAICompatibleLLM(
        "fake-model", base_url=f"{fake_api.url}/v1", timeout=0.4, total_timeout=1.0,
        max_retries=9,
    )
    with pytest.raises(LLMTimeoutError, match=r"total_timeout=1s") as info:
        await llm.complete(REQUEST)
    assert "fake-model" in str(info.value)
    assert len(fake_api.requests) <= 3  # 0.4 s + 0.4 s + what is left, never 10 attempts


async def test_a_retry_after_beyond_the_cap_fails_at_once(fake_api: FakeAPI) -> None:
    sleeps = Sleeps()
    fake_api.plan(*[Reply(429, {"error": {"message": "quota"}}, headers={"Retry-After": "300"})
                    for _ in range(4)])
    with pytest.raises(LLMRateLimitError) as info:
        await make(fake_api, sleeps).complete(REQUEST)
    message = str(info.value)
    assert "provider asked to wait 300 s, more than the cap 60 s (max_retry_after)" in message
    assert "HTTP 429 rate limited: quota" in message
    assert isinstance(info.value.__cause__, openai.RateLimitError)
    assert len(fake_api.requests) == 1
    assert sleeps.delays == []
