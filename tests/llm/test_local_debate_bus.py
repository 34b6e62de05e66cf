"""A whole debate with the embedded model, requested and answered through Redis Streams."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from debatebus import Debate, Participant
from debatebus._worker import DebateBus
from debatebus.client import BusClient
from tests.support.llm import HAVE_LLAMA, NO_LLAMA

pytestmark = [
    pytest.mark.local_llm,
    pytest.mark.redis,
    pytest.mark.skipif(not HAVE_LLAMA, reason=NO_LLAMA),
]


async def test_local_model_debate_over_redis_streams_completes(
    redis_server: object, model_path: object
) -> None:
    from debatebus.llm._local import LocalLLM

    # Short answers keep this quick on a busy 2-core machine; the shape is what is checked.
    llm = LocalLLM(model_path, max_tokens=48, seed=3)  # type: ignore[arg-type]
    debate = Debate(
        "local-bus",
        [
            Participant("optimist", "Argue for. One sentence."),
            Participant("critic", "Argue against. One sentence."),
        ],
        llm=llm,
        moderator=Participant("moderator", "Moderate neutrally. Two sentences at most."),
        max_rounds=1,
    )
    url = redis_server.url  # type: ignore[attr-defined]
    event_type = f"debate:local{uuid.uuid4().hex[:8]}"
    app = DebateBus(url, transport_options={"claim_idle_ms": 60_000, "block_ms": 100})
    app.subscribe(event_type, debate.as_handler())
    async with app, BusClient(url, block_ms=100) as client:
        worker = asyncio.create_task(app.run())
        try:
            result = await client.request(
                event_type, {"input": "Should cities ban cars?"}, timeout=240
            )
        finally:
            app.stop()
            await asyncio.wait_for(worker, 240)
    payload = result.payload
    assert payload["debateStatus"] == "completed", payload["debateError"]
    assert payload["debateRounds"] == 1
    assert payload["debateSynthesis"] is not None
    usage = payload["debateTokenUsage"]
    assert usage["promptTokens"] > 0
    assert usage["completionTokens"] > 0
    assert usage["totalTokens"] == usage["promptTokens"] + usage["completionTokens"]
