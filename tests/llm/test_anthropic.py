"""AnthropicLLM against a local HTTP server speaking the Messages API shape."""

from __future__ import annotations

import sys
import traceback
from typing import Any

import anthropic
import pytest
from pydantic import BaseModel

from debatebus._usage import TokenUsage
from debatebus.exceptions import LLMError, LLMRateLimitError, LLMResponseError, LLMTimeoutError
from debatebus.llm import AnthropicLLM, LLMRequest, Message
from debatebus.llm._retry import RetryPolicy
from tests.llm.servers import FakeAPI, Reply, anthropic_error, anthropic_message
from tests.support.llm import Sleeps

KEY = "sk-ant-api03-test-0123456789abcdef"
REQUEST = LLMRequest(
    "You are the critic.",
    (Message("user", "Topic: cats"), Message("assistant", "Cats rule."), Message("user", "Rebut.")),
)


class Verdict(BaseModel):
    consensus: bool
    summary: str


def make(
    api: FakeAPI, sleeps: Sleeps | None = None, *, max_retries: int = 3, **kwargs: Any
) -> AnthropicLLM:
    policy = RetryPolicy(max_retries=max_retries, timeout=30.0, sleep=sleeps or Sleeps())
    return AnthropicLLM("claude-test", api_key=KEY, base_url=api.url, retry_policy=policy, **kwargs)


async def test_request_shape(fake_api: FakeAPI) -> None:
    await make(fake_api, max_tokens=300).complete(REQUEST)
    [sent] = fake_api.requests
    assert sent.method == "POST"
    assert sent.path == "/v1/messages"
    assert sent.body == {
        "model": "claude-test",
        "max_tokens": 300,
        "system": "You are the critic.",
        "messages": [
            {"role": "user", "content": "Topic: cats"},
            {"role": "assistant", "content": "Cats rule."},
            {"role": "user", "content": "Rebut."},
        ],
    }
    # The key travels as x-api-key or, with recent SDKs, as a bearer token.
    sent_key = sent.headers.get("x-api-key") or sent.headers["authorization"].removeprefix(
        "Bearer "
    )
    assert sent_key == KEY
    assert "anthropic-version" in sent.headers


async def test_request_max_tokens_and_temperature(fake_api: FakeAPI) -> None:
    request = LLMRequest("", (Message("user", "hi"),), max_tokens=12)
    await make(fake_api, temperature=0.2).complete(request)
    body = fake_api.bodies()[0]
    assert body["max_tokens"] == 12
    assert body["temperature"] == 0.2
    assert "system" not in body  # an empty system prompt is omitted, not sent as ""


async def test_text_and_usage_mapping_counts_cached_input(fake_api: FakeAPI) -> None:
    reply = anthropic_message(
        "Dogs, though.",
        input_tokens=10,
        output_tokens=4,
        cache_creation_input_tokens=5,
        cache_read_input_tokens=2,
    )
    fake_api.plan(Reply(json=reply))
    response = await make(fake_api).complete(REQUEST)
    assert response.text == "Dogs, though."
    # Anthropic's input_tokens leaves the cached ones out: the prompt carried all 17.
    assert response.usage == TokenUsage(17, 4, 21, cache_read_tokens=2, cache_write_tokens=5)
    assert response.model == "claude-test"


async def test_several_text_blocks_are_joined(fake_api: FakeAPI) -> None:
    reply = anthropic_message()
    reply["content"] = [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}]
    fake_api.plan(Reply(json=reply))
    assert (await make(fake_api).complete(REQUEST)).text == "one two"


async def test_rate_limit_is_retried_with_retry_after(fake_api: FakeAPI) -> None:
    sleeps = Sleeps()
    fake_api.plan(
        Reply(429, anthropic_error(429, "rate_limit_error", "slow"), headers={"retry-after": "3"})
    )
    assert (await make(fake_api, sleeps).complete(REQUEST)).text == "ok"
    assert sleeps.delays == [3.0]


async def test_persistent_rate_limit(fake_api: FakeAPI) -> None:
    fake_api.plan(*[Reply(429, anthropic_error(429, "rate_limit_error", "slow")) for _ in range(2)])
    with pytest.raises(LLMRateLimitError, match="claude-test: HTTP 429 rate limited: slow") as info:
        await make(fake_api, max_retries=1).complete(REQUEST)
    assert isinstance(info.value.__cause__, anthropic.RateLimitError)


@pytest.mark.parametrize("status", [500, 529])
async def test_server_errors_and_overload_are_retried(fake_api: FakeAPI, status: int) -> None:
    fake_api.plan(Reply(status, anthropic_error(status, "overloaded_error", "busy")))
    assert (await make(fake_api).complete(REQUEST)).text == "ok"
    assert len(fake_api.requests) == 2


async def test_persistent_server_error(fake_api: FakeAPI) -> None:
    fake_api.plan(*[Reply(500, anthropic_error(500, "api_error", "boom")) for _ in range(2)])
    with pytest.raises(LLMError, match="HTTP 500 server error: boom") as info:
        await make(fake_api, max_retries=1).complete(REQUEST)
    assert isinstance(info.value.__cause__, anthropic.InternalServerError)


async def test_bad_request_is_final(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(400, anthropic_error(400, "invalid_request_error", "max_tokens: bad")))
    with pytest.raises(LLMError, match="HTTP 400 request rejected: max_tokens: bad") as info:
        await make(fake_api).complete(REQUEST)
    assert type(info.value) is LLMError
    assert isinstance(info.value.__cause__, anthropic.BadRequestError)
    assert len(fake_api.requests) == 1


async def test_timeout(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(delay=30))
    llm = AnthropicLLM(
        "claude-test", api_key=KEY, base_url=fake_api.url, timeout=0.5, max_retries=0
    )
    with pytest.raises(LLMTimeoutError):
        await llm.complete(REQUEST)


async def test_malformed_body(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(text="{not json"))
    with pytest.raises(LLMResponseError, match="malformed response"):
        await make(fake_api).complete(REQUEST)


async def test_structured_output_with_repair(fake_api: FakeAPI) -> None:
    fake_api.plan(
        Reply(json=anthropic_message("I'd say they agree.", 30, 6)),
        Reply(json=anthropic_message('{"consensus": true, "summary": "agreed"}', 50, 9)),
    )
    request = LLMRequest("Judge.", (Message("user", "a: yes\nb: yes"),), response_schema=Verdict)
    response = await make(fake_api).complete(request)
    assert response.structured == Verdict(consensus=True, summary="agreed")
    assert response.usage == TokenUsage(80, 15, 95)
    first, second = fake_api.bodies()
    assert first["system"] == "Judge."  # the schema closes the prompt instead
    assert "JSON schema" in first["messages"][0]["content"]
    assert second["messages"][-2] == {"role": "assistant", "content": "I'd say they agree."}


async def test_structured_output_failure_quotes_raw_text(fake_api: FakeAPI) -> None:
    fake_api.plan(*[Reply(json=anthropic_message("no json here", 30, 6)) for _ in range(2)])
    request = LLMRequest("Judge.", (Message("user", "x"),), response_schema=Verdict)
    with pytest.raises(
        LLMResponseError, match=r"claude-test: no valid Verdict.*'no json here'"
    ) as info:
        await make(fake_api).complete(request)
    assert info.value.usage == TokenUsage(60, 12, 72)


async def test_key_is_redacted(fake_api: FakeAPI) -> None:
    fake_api.plan(
        Reply(401, anthropic_error(401, "authentication_error", f"invalid x-api-key {KEY}"))
    )
    llm = make(fake_api)
    with pytest.raises(LLMError) as info:
        await llm.complete(REQUEST)
    assert KEY not in "".join(traceback.format_exception(info.value))
    assert KEY not in repr(llm)
    assert isinstance(info.value.__cause__, anthropic.AuthenticationError)


def test_import_without_the_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)
    monkeypatch.delitem(sys.modules, "debatebus.llm._anthropic_llm", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'debatebus\[anthropic\]'"):
        import debatebus.llm._anthropic_llm  # noqa: F401
