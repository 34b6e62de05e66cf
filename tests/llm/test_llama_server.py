"""OpenAICompatibleLLM against a real OpenAI-compatible server: llama-cpp-python's own."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel, Field

from debatebus.llm import LLMRequest, Message, OpenAICompatibleLLM
from tests.llm.servers import LlamaServer
from tests.support.llm import HAVE_LLAMA, NO_LLAMA

pytestmark = [pytest.mark.local_llm, pytest.mark.skipif(not HAVE_LLAMA, reason=NO_LLAMA)]


class Verdict(BaseModel):
    consensus: bool
    summary: str = Field(max_length=300)  # bounds the server's grammar for a tiny model
    winner: str | None = None


TURN = LLMRequest(
    "You are the critic in a debate. Answer in one sentence.",
    (Message("user", "Topic: Should cities ban cars? Give your opening statement."),),
)
JUDGE = LLMRequest(
    "You are the judge of a debate. Decide whether the participants reached consensus.",
    (Message("user", "optimist: Ban cars.\ncritic: Keep cars.\nGive your verdict."),),
    response_schema=Verdict,
)


def make(server: LlamaServer) -> OpenAICompatibleLLM:
    return OpenAICompatibleLLM("smollm2", base_url=server.base_url, max_tokens=256, timeout=120)


async def test_completion_shape_and_usage(llama_server: LlamaServer) -> None:
    response = await make(llama_server).complete(TURN)
    assert isinstance(response.text, str)
    assert response.model == "smollm2"
    assert response.usage is not None
    assert response.usage.prompt_tokens > 0
    assert response.usage.completion_tokens > 0
    assert response.usage.total_tokens == (
        response.usage.prompt_tokens + response.usage.completion_tokens
    )


async def test_judge_verdict_validates(llama_server: LlamaServer) -> None:
    # The server rejects json_schema; "auto" steps down to json_object + schema (a grammar).
    llm = make(llama_server)
    for _ in range(2):
        response = await llm.complete(JUDGE)
        assert isinstance(response.structured, Verdict)
        assert response.usage is not None
        assert response.usage.completion_tokens > 0


async def test_concurrent_requests(llama_server: LlamaServer) -> None:
    llm = make(llama_server)
    responses = await asyncio.gather(llm.complete(TURN), llm.complete(TURN))
    assert all(r.usage is not None for r in responses)
