"""``LLM.stream``: every model writes its answer piece by piece and ends with the response
``complete`` would give (text and usage); the providers against a local HTTP server that streams
server-sent events, the embedded model in process."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from debatebus._usage import TokenUsage
from debatebus.exceptions import ConfigError, LLMError, LLMRateLimitError
from debatebus.llm import (
    LLM,
    FunctionLLM,
    LLMRequest,
    LLMResponse,
    LLMStream,
    MemoryRateLimiter,
    Message,
    RateLimit,
    RateLimitedLLM,
    ScriptedLLM,
)
from debatebus.llm._anthropic_llm import AnthropicLLM
from debatebus.llm._openai_compat import OpenAICompatibleLLM
from debatebus.llm._retry import RetryPolicy
from tests.llm.servers import FakeAPI, Reply, anthropic_events, chat_chunks, chat_completion
from tests.support.llm import HAVE_LLAMA, NO_LLAMA, Sleeps

REQUEST = LLMRequest("You are terse.", (Message("user", "Say hi."),), speaker="a", purpose="turn")
PIECES = ["Hello", " there", ", how", " are", " you", "?"]


class Verdict(BaseModel):
    consensus: bool


async def read(stream: LLMStream) -> tuple[list[str], LLMResponse]:
    async with stream:
        pieces = [piece async for piece in stream]
    assert stream.response is not None
    return pieces, stream.response


# ---- the seam and the fakes -------------------------------------------------------------------


class OnlyComplete(LLM):
    """A model written before streaming: ``complete`` only, ``stream`` inherited."""

    @property
    def model(self) -> str:
        return "only-complete"

    async def complete(self, request: LLMRequest) -> LLMResponse:
        return LLMResponse("whole answer", None, TokenUsage.of(3, 2), self.model)


async def test_the_default_stream_is_the_complete_answer_in_one_piece() -> None:
    pieces, response = await read(OnlyComplete().stream(REQUEST))
    assert pieces == ["whole answer"]
    assert (response.text, response.usage) == ("whole answer", TokenUsage.of(3, 2))


async def test_fakes_stream_a_word_at_a_time_and_end_with_the_same_response() -> None:
    text = "  Spaces stay,\nnewlines too.  "
    llm = FunctionLLM(lambda request: text)
    pieces, response = await read(llm.stream(REQUEST))
    whole = await llm.complete(REQUEST)
    assert pieces == ["  ", "Spaces ", "stay,\n", "newlines ", "too.  "]
    assert "".join(pieces) == response.text == whole.text
    assert response.usage == whole.usage
    scripted = ScriptedLLM(["one two", {"consensus": True}])
    assert (await read(scripted.stream(REQUEST)))[0] == ["one ", "two"]
    judged = LLMRequest("s", (Message("user", "u"),), response_schema=Verdict)
    pieces, response = await read(scripted.stream(judged))
    assert pieces == ['{"consensus": true}']  # structured output comes whole
    assert response.structured == Verdict(consensus=True)


async def test_a_fake_raises_from_its_stream_as_from_complete() -> None:
    llm = ScriptedLLM([LLMRateLimitError("slow down")])
    with pytest.raises(LLMRateLimitError, match="slow down"):
        await read(llm.stream(REQUEST))


def test_a_fake_refuses_a_negative_pause() -> None:
    with pytest.raises(ConfigError, match="stream_pause_s"):
        FunctionLLM(lambda request: "x", stream_pause_s=-1)


async def test_a_rate_limited_stream_is_charged_its_real_usage() -> None:
    limiter = MemoryRateLimiter("m", RateLimit(tokens_per_minute=100_000))
    llm = RateLimitedLLM(FunctionLLM(lambda request: "a b c"), limiter, default_max_tokens=50)
    pieces, response = await read(llm.stream(REQUEST))
    assert pieces == ["a ", "b ", "c"]
    assert response.usage is not None
    # Waits for nobody: the estimate was corrected to the usage once the stream ended.
    assert await limiter.acquire(tokens=100_000 - response.usage.total_tokens)


# ---- OpenAI-compatible servers ----------------------------------------------------------------


def openai_llm(api: FakeAPI, **kwargs: Any) -> OpenAICompatibleLLM:
    policy = RetryPolicy(max_retries=2, timeout=30.0, sleep=Sleeps())
    return OpenAICompatibleLLM("fake-model", base_url=f"{api.url}/v1", retry_policy=policy,
                               **kwargs)


async def test_openai_streams_pieces_then_the_usage_of_the_last_chunk(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(stream=chat_chunks(PIECES, prompt_tokens=17, completion_tokens=6),
                        stream_delay=0.05))
    pieces, response = await read(openai_llm(fake_api, max_tokens=64).stream(REQUEST))
    assert pieces == PIECES  # read as they come: a piece per event written on its own
    assert response.text == "".join(PIECES)
    assert (response.usage, response.model) == (TokenUsage.of(17, 6), "fake-model")
    (body,) = fake_api.bodies()
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 64


async def test_openai_paced_stream_hands_on_each_reads_events_as_one_piece(
        fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(stream=chat_chunks(PIECES, completion_tokens=6), stream_delay=0.05))
    pieces, response = await read(openai_llm(fake_api).stream(REQUEST, interval_s=0.3))
    # The first read at once, then one every 0.3 s: what the server wrote meanwhile in one piece.
    assert len(pieces) < len(PIECES)
    assert "".join(pieces) == response.text == "".join(PIECES)
    assert response.usage == TokenUsage.of(11, 6)


async def test_openai_retries_a_stream_the_server_refused(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(status=503, json={"error": {"message": "overloaded"}}),
                  Reply(stream=chat_chunks(PIECES)))
    pieces, _ = await read(openai_llm(fake_api).stream(REQUEST))
    assert "".join(pieces) == "".join(PIECES)
    assert len(fake_api.requests) == 2


async def test_openai_stream_broken_off_is_an_llm_error_and_not_retried(
        fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(stream=chat_chunks(PIECES), break_off=True))
    got: list[str] = []

    async def read_all() -> None:
        async for piece in openai_llm(fake_api).stream(REQUEST):
            got.append(piece)

    with pytest.raises(LLMError, match=r"fake-model: the answer's stream from .* broke off"):
        await read_all()
    assert "".join(got) == "".join(PIECES[:4])  # what came before the break was handed on
    assert len(fake_api.requests) == 1


async def test_openai_stream_says_what_the_server_reported_mid_stream(fake_api: FakeAPI) -> None:
    error = b'data: {"error": {"message": "the model overheated", "type": "server_error"}}\n\n'
    fake_api.plan(Reply(stream=(*chat_chunks(PIECES)[:3], error)),
                  Reply(stream=(*chat_chunks(PIECES)[:2], b"data: {not json\n\n")))
    llm = openai_llm(fake_api)
    with pytest.raises(LLMError, match="the server reported an error: the model overheated"):
        await read(llm.stream(REQUEST))
    with pytest.raises(LLMError, match=re.escape("malformed stream event '{not json'")):
        await read(llm.stream(REQUEST))
    assert len(fake_api.requests) == 2  # neither retried: text may have been handed on


async def test_openai_streams_structured_requests_whole(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(json=chat_completion('{"consensus": false}')))
    judged = LLMRequest("s", (Message("user", "u"),), response_schema=Verdict)
    pieces, response = await read(openai_llm(fake_api, structured="instructions").stream(judged))
    assert pieces == ['{"consensus": false}']
    assert response.structured == Verdict(consensus=False)
    assert "stream" not in fake_api.bodies()[0]


# ---- Anthropic --------------------------------------------------------------------------------


async def test_anthropic_streams_text_deltas_with_the_usage_of_start_and_delta(
        fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(stream=anthropic_events(PIECES, input_tokens=12, output_tokens=7),
                        stream_delay=0.05))
    llm = AnthropicLLM("fake-claude", base_url=fake_api.url,
                       retry_policy=RetryPolicy(max_retries=1, sleep=Sleeps()))
    pieces, response = await read(llm.stream(REQUEST))
    assert pieces == PIECES  # read as they come: a piece per event written on its own
    assert (response.text, response.usage) == ("".join(PIECES), TokenUsage.of(12, 7))
    (body,) = fake_api.bodies()
    assert body["stream"] is True
    assert body["system"] == "You are terse."


# ---- the embedded model -----------------------------------------------------------------------


@pytest.mark.local_llm
@pytest.mark.skipif(not HAVE_LLAMA, reason=NO_LLAMA)
async def test_the_embedded_model_streams_tokens_as_llama_cpp_writes_them(
        model_path: Path) -> None:
    from debatebus.llm._local import LocalLLM

    llm = LocalLLM(model_path, seed=7, max_tokens=24, n_ctx=1024, n_threads=2)
    pieces, response = await read(llm.stream(REQUEST))
    assert len(pieces) > 1
    assert "".join(pieces) == response.text
    assert response.usage is not None
    assert response.usage.completion_tokens == len(pieces) <= 24
    # The same prompt in one piece: the same prompt tokens (the stream's are counted, not sent).
    whole = await llm.complete(REQUEST)
    assert whole.usage is not None
    assert response.usage.prompt_tokens == whole.usage.prompt_tokens
    # A stream left early stops the model: the next call is answered.
    async with llm.stream(REQUEST) as early:
        async for _ in early:
            break
    assert (await llm.complete(REQUEST)).text
