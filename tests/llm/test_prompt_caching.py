"""Prompt caching through the real SDK providers: Anthropic's ``cache_control`` breakpoints where
the engine marks its shared prefixes, OpenAI's per-debate ``prompt_cache_key``, cached tokens
read from both SDKs' usage objects, the once-only note about prompts too short to cache, and a
whole debate against endpoints that apply each provider's caching rules."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from debatebus import Debate, Judge, Participant
from debatebus._pricing import DEFAULT_PRICES
from debatebus._usage import TokenUsage
from debatebus.llm import AnthropicLLM, LLMRequest, Message, OpenAICompatibleLLM
from debatebus.llm._openai_compat import prompt_cache_key
from debatebus.llm._retry import RetryPolicy
from tests.llm.servers import FakeAPI, Reply, anthropic_message, chat_completion
from tests.support.caching import AnthropicCache, CachingAPI, OpenAICache

HEAD = "Debate topic: tabs or spaces?\nTranscript so far:\n"
TURNS = ["Round 1:\nann said:\n> Tabs.", "\nbob said:\n> Spaces."]
TAIL = "\n\n---\nNow it is cyd's turn. You decide.\nRound 1: give your position."
CONTENT = HEAD + "".join(TURNS) + TAIL
BREAKS = (len(HEAD), len(HEAD) + len(TURNS[0]), len(HEAD) + len(TURNS[0]) + len(TURNS[1]))
TURN = LLMRequest("You take part in a debate.", (Message("user", CONTENT, BREAKS),),
                  speaker="cyd", purpose="opening", round=1, cache_key="debate-7")


def anthropic(api: FakeAPI | CachingAPI, model: str = "claude-test", **kwargs: Any) -> AnthropicLLM:
    return AnthropicLLM(model, api_key="sk-ant-test", base_url=api.url,
                        retry_policy=RetryPolicy(max_retries=0), **kwargs)


def openai(api: FakeAPI | CachingAPI, model: str = "fake-model", **kwargs: Any
           ) -> OpenAICompatibleLLM:
    return OpenAICompatibleLLM(model, api_key="sk-test", base_url=f"{api.url}/v1",
                               retry_policy=RetryPolicy(max_retries=0), **kwargs)


# ---- Anthropic: breakpoints ---------------------------------------------------------------------


def _blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    [message] = body["messages"]
    blocks: list[dict[str, Any]] = message["content"]
    return blocks


async def test_the_shared_prefix_is_cut_into_blocks_with_breakpoints(fake_api: FakeAPI) -> None:
    await anthropic(fake_api).complete(TURN)
    [body] = fake_api.bodies()
    assert body["system"] == "You take part in a debate."  # the head's marks cover it too
    blocks = _blocks(body)
    assert [b["text"] for b in blocks] == [HEAD, *TURNS, TAIL]
    assert all(b["type"] == "text" for b in blocks)
    # After the system text and question (the head), and at the end of the transcript so far;
    # the turn between them is a block boundary the lookback finds an earlier write at.
    marked = [i for i, b in enumerate(blocks) if "cache_control" in b]
    assert marked == [0, 2]
    assert blocks[2]["cache_control"] == {"type": "ephemeral"}


async def test_a_long_transcript_gets_breakpoints_within_the_lookback(fake_api: FakeAPI) -> None:
    """Anthropic looks back ~20 blocks from a breakpoint: with 45 turns, marks in between keep
    every earlier call's write in reach, and never more than 4 marks."""
    turns = [f"\nspeaker{i} said:\n> point {i}." for i in range(45)]
    content = HEAD + "".join(turns) + TAIL
    ends, at = [len(HEAD)], len(HEAD)
    for turn in turns:
        at += len(turn)
        ends.append(at)
    request = LLMRequest("S.", (Message("user", content, tuple(ends)),), cache_key="d")
    await anthropic(fake_api).complete(request)
    blocks = _blocks(fake_api.bodies()[0])
    marked = [i for i, b in enumerate(blocks) if "cache_control" in b]
    assert len(blocks) == 47 and len(marked) == 4
    assert marked[0] == 0 and marked[-1] == 45  # the head, and the end of the transcript
    for boundary in range(46):  # every boundary an earlier call may have written at
        assert any(0 <= mark - boundary < 20 for mark in marked), boundary


async def test_a_blank_piece_joins_the_next_block(fake_api: FakeAPI) -> None:
    """The API refuses blank text blocks: a break that would make one is not cut."""
    request = LLMRequest("S.", (Message("user", "Head.\n\n\nRest.", (5, 7)),))
    await anthropic(fake_api).complete(request)
    assert [b["text"] for b in _blocks(fake_api.bodies()[0])] == ["Head.", "\n\n\nRest."]


async def test_caching_off_sends_plain_text(fake_api: FakeAPI) -> None:
    await anthropic(fake_api, prompt_caching=False).complete(TURN)
    [body] = fake_api.bodies()
    assert body["messages"] == [{"role": "user", "content": CONTENT}]


async def test_anthropic_usage_counts_cache_reads_and_writes(fake_api: FakeAPI) -> None:
    fake_api.plan(Reply(json=anthropic_message("ok", input_tokens=40, output_tokens=9,
                                               cache_read_input_tokens=1200,
                                               cache_creation_input_tokens=300)))
    response = await anthropic(fake_api).complete(TURN)
    assert response.usage == TokenUsage(1540, 9, 1549, cache_read_tokens=1200,
                                        cache_write_tokens=300)


# ---- OpenAI: the cache key and cached tokens ----------------------------------------------------


async def test_openai_usage_reads_cached_tokens(fake_api: FakeAPI) -> None:
    reply = chat_completion("ok", prompt_tokens=2048, completion_tokens=5)
    reply["usage"]["prompt_tokens_details"] = {"cached_tokens": 1920, "audio_tokens": 0}
    fake_api.plan(Reply(json=reply), Reply(json=chat_completion("ok", 30, 5)))
    llm = openai(fake_api)
    assert (await llm.complete(TURN)).usage == TokenUsage(2048, 5, 2053, cache_read_tokens=1920)
    assert (await llm.complete(TURN)).usage == TokenUsage(30, 5, 35)  # no details: nothing read


async def test_a_debate_is_routed_by_a_cache_key_of_its_own(fake_api: FakeAPI) -> None:
    llm = openai(fake_api, send_prompt_cache_key=True)
    await llm.complete(TURN)
    await llm.complete(TURN)
    other = LLMRequest("S.", (Message("user", "hi"),), cache_key="debate-8")
    await llm.complete(other)
    keys = [body["prompt_cache_key"] for body in fake_api.bodies()]
    assert keys[0] == keys[1] == prompt_cache_key("debate-7") != keys[2]
    assert all("debate-7" not in key for key in keys)  # the debate's id stays here
    # The prompt is sent as it is: the breaks change nothing in its bytes.
    assert fake_api.bodies()[0]["messages"][1] == {"role": "user", "content": CONTENT}


async def test_no_cache_key_for_a_server_not_known_to_take_it(fake_api: FakeAPI) -> None:
    await openai(fake_api).complete(TURN)  # a loopback server: off unless asked for
    await openai(fake_api, send_prompt_cache_key=False).complete(TURN)
    assert all("prompt_cache_key" not in body for body in fake_api.bodies())


# ---- prompts too short to cache -----------------------------------------------------------------


async def test_a_prompt_too_short_to_cache_is_said_once(fake_api: FakeAPI,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="debatebus.llm")
    fake_api.plan(*[Reply(json=chat_completion("ok", 600, 5)) for _ in range(2)],
                  *[Reply(json=anthropic_message("ok", 500, 5)) for _ in range(2)],
                  Reply(json=anthropic_message("ok", 5000, 5)))
    llm = openai(fake_api, send_prompt_cache_key=True)
    await llm.complete(TURN)
    await llm.complete(TURN)
    claude = anthropic(fake_api, model="claude-haiku-4-5")  # caches from 4096 tokens
    for _ in range(3):
        await claude.complete(TURN)
    notes = [r.getMessage() for r in caplog.records if "caches at least" in r.getMessage()]
    assert len(notes) == 2, notes
    assert "a prompt of 600 tokens is below the 1024 tokens" in notes[0]
    assert "claude-haiku-4-5: a prompt of 500 tokens is below the 4096 tokens" in notes[1]
    assert all(r.levelno == logging.DEBUG for r in caplog.records if "caches" in r.getMessage())


# ---- a whole debate under each provider's rules -------------------------------------------------


def _answer(api: str, body: dict[str, Any]) -> str:
    content = body["messages"][-1]["content"]
    text = content if isinstance(content, str) else "".join(b["text"] for b in content)
    if "JSON schema" in text:
        return '{"consensus": false, "summary": "They still disagree."}'
    words = " ".join(f"reason{i} weighs on the budget" for i in range(40))
    return f"My view on this turn: {words}."


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_later_turns_read_what_earlier_turns_wrote(kind: str) -> None:
    api = CachingAPI(_answer, anthropic=AnthropicCache(min_tokens=1024),
                     openai=OpenAICache()).start()
    try:
        llm = (anthropic(api, "claude-sonnet-4-5") if kind == "anthropic"
               else openai(api, "gpt-4.1-mini", send_prompt_cache_key=True))
        debate = Debate("cache", [Participant(n, f"You are {n}.") for n in ("ann", "bob", "cyd")],
                        llm=llm, moderator=Participant("mod", "You moderate."), judge=Judge(),
                        max_rounds=3, prices=DEFAULT_PRICES)
        result = await debate.run("Tabs or spaces?")
    finally:
        api.stop()
    assert result.ok, result.error
    billed = api.billed
    usage = result.token_usage
    # debatebus counts what the provider billed.
    assert usage.prompt_tokens == sum(b.prompt for b in billed)
    assert usage.cache_read_tokens == sum(b.cache_read for b in billed) > 0
    assert usage.cache_write_tokens == sum(b.cache_write for b in billed)
    # Once prompts pass the minimum, every call reads the prefix an earlier call left.
    long_enough = [b for b in billed[1:] if b.prompt - 300 >= 1024]
    assert long_enough and all(b.cache_read > 0 for b in long_enough)
    assert usage.cache_read_tokens > usage.prompt_tokens / 3
    if kind == "anthropic":
        assert max(api.anthropic.breakpoints_seen) <= 4
    else:
        assert len(set(api.openai.keys_seen)) == 1  # one route for the whole debate
    assert result.cost is not None
