"""Remote providers pass a turn's stop sequences on: OpenAI's first 4 (its limit), all of them as
Anthropic's ``stop_sequences``; none when the request has none."""

from __future__ import annotations

from debatebus.llm import AnthropicLLM, LLMRequest, Message
from debatebus.llm._openai_compat import OpenAICompatibleLLM
from tests.llm.servers import FakeAPI

STOPS = ("[critic]", "\ncritic said:", "\ncritic:", "[judge]", "\nRound ", "\n---")
TURN = LLMRequest("You argue for.", (Message("user", "Your turn."),), speaker="optimist",
                  purpose="opening", stop=STOPS)
NO_STOPS = LLMRequest("You argue for.", (Message("user", "Your turn."),))


async def test_openai_compatible_sends_the_first_four_stop_sequences(fake_api: FakeAPI) -> None:
    llm = OpenAICompatibleLLM("fake-model", base_url=f"{fake_api.url}/v1", max_retries=0)
    await llm.complete(TURN)
    await llm.complete(NO_STOPS)
    with_stops, without = fake_api.bodies()
    assert with_stops["stop"] == ["[critic]", "\ncritic said:", "\ncritic:", "[judge]"]
    assert "stop" not in without
    await llm.aclose()


async def test_anthropic_sends_every_stop_sequence(fake_api: FakeAPI) -> None:
    llm = AnthropicLLM("claude-test", api_key="sk-ant-test", base_url=fake_api.url, max_retries=0)
    await llm.complete(TURN)
    await llm.complete(NO_STOPS)
    with_stops, without = fake_api.bodies()
    assert with_stops["stop_sequences"] == list(STOPS)
    assert "stop_sequences" not in without
    await llm.aclose()
