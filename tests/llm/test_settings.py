"""ALLOW_MODEL_REQUESTS: paid providers are blocked before any network traffic; loopback never is."""

from __future__ import annotations

import socket
from typing import Any

import pytest

import debatebus.llm
from debatebus.exceptions import LLMError, ModelRequestsNotAllowedError
from debatebus.llm import (
    AnthropicLLM,
    LLMRequest,
    Message,
    OpenAICompatibleLLM,
    check_model_requests_allowed,
    is_paid_url,
    override_allow_model_requests,
)
from tests.llm.servers import FakeAPI

REQUEST = LLMRequest("s", (Message("user", "hi"),))


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Any name lookup or connection attempt is recorded and fails the call."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise OSError("network access during a test that must not use it")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def test_the_test_suite_runs_with_model_requests_disallowed() -> None:
    assert debatebus.llm.ALLOW_MODEL_REQUESTS is False


@pytest.mark.parametrize(
    ("url", "paid"),
    [
        (None, True),
        ("https://api.openai.com/v1", True),
        ("https://API.OpenAI.com/v1/", True),
        ("https://api.anthropic.com", True),
        ("https://eu.api.openai.com/v1", True),
        ("http://127.0.0.1:8080/v1", False),
        ("http://localhost:11434/v1", False),
        ("http://[::1]:8000/v1", False),
        ("http://gpu-box.internal:8000/v1", False),
        ("https://notopenai.com/v1", False),
    ],
)
def test_paid_urls(url: str | None, paid: bool) -> None:
    assert is_paid_url(url) is paid


@pytest.mark.parametrize(
    "make",
    [
        lambda: OpenAICompatibleLLM("gpt-4o-mini", api_key="sk-test-000000000000"),
        lambda: OpenAICompatibleLLM(
            "gpt-4o-mini", api_key="sk-test-000000000000", base_url="https://api.openai.com/v1"
        ),
        lambda: AnthropicLLM("claude-3-5-haiku-latest", api_key="sk-ant-test-000000000000"),
    ],
    ids=["openai-default", "openai-explicit", "anthropic-default"],
)
async def test_paid_providers_are_blocked_without_network(make: Any, no_network: list[Any]) -> None:
    llm = make()
    with pytest.raises(ModelRequestsNotAllowedError, match="ALLOW_MODEL_REQUESTS is False"):
        await llm.complete(REQUEST)
    assert no_network == []


async def test_flag_is_read_at_call_time(no_network: list[Any]) -> None:
    llm = OpenAICompatibleLLM("gpt-4o-mini", api_key="sk-test-000000000000")
    with override_allow_model_requests(True):
        check_model_requests_allowed(llm.model, llm.base_url)  # no error while allowed
    assert debatebus.llm.ALLOW_MODEL_REQUESTS is False
    with pytest.raises(ModelRequestsNotAllowedError):
        await llm.complete(REQUEST)


async def test_loopback_servers_are_always_allowed(fake_api: FakeAPI) -> None:
    assert debatebus.llm.ALLOW_MODEL_REQUESTS is False
    llm = OpenAICompatibleLLM("local-model", base_url=f"{fake_api.url}/v1")
    assert (await llm.complete(REQUEST)).text == "ok"


def test_the_block_is_an_llm_error_so_failure_policies_apply() -> None:
    assert issubclass(ModelRequestsNotAllowedError, LLMError)
