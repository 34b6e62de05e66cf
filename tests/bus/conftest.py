"""Bus-level fixtures: a broker URL per transport kind, and a worker running in the test's loop."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from debatebus import Debate, FunctionLLM, Judge, LLMRequest, Participant
from debatebus.transports.memory import MemoryBroker, MemoryTransport
from debatebus.worker import DebateBus

BUS_KINDS = ["memory", "redis_streams", "redis_pubsub", "kafka"]


def instant_llm() -> FunctionLLM:
    def answer(request: LLMRequest) -> Any:
        if request.purpose == "judge":
            return {"consensus": request.round >= 2, "summary": f"after round {request.round}"}
        return f"{request.speaker} on round {request.round}: a considered view"

    return FunctionLLM(answer)


def make_debate(llm: Any = None, **options: Any) -> Debate:
    llm = llm or instant_llm()
    options.setdefault("moderator", Participant("moderator", "Moderate."))
    options.setdefault("judge", Judge())
    return Debate("bus-debate", [Participant("optimist", "Argue for."),
                                 Participant("critic", "Argue against.")], llm=llm, **options)


@pytest.fixture(params=BUS_KINDS)
def bus_url(request: pytest.FixtureRequest) -> str:
    kind = request.param
    if kind == "memory":
        return "memory://"
    if kind == "kafka":
        return str(request.getfixturevalue("tansu_server").url)
    server = request.getfixturevalue("redis_server")
    return server.url if kind == "redis_streams" else server.url.replace("redis://", "redis+pubsub://")


def transport_options(url: str) -> dict[str, Any]:
    if url.startswith("kafka://"):
        return {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}
    if url.startswith("redis://"):
        return {"claim_idle_ms": 1000, "block_ms": 100}
    return {}


@pytest.fixture
def event_type() -> str:
    return f"debate:request{uuid.uuid4().hex[:8]}"


@contextlib.asynccontextmanager
async def running(app: DebateBus) -> AsyncIterator[DebateBus]:
    """Serve ``app`` in the background for the duration of the block, then drain and close."""
    async with app:
        task = asyncio.create_task(app.run())
        await asyncio.sleep(0)
        try:
            yield app
        finally:
            app.stop()
            await asyncio.wait_for(task, 60)


def memory_app(**options: Any) -> DebateBus:
    return DebateBus(MemoryTransport(MemoryBroker(claim_idle_s=0.5)), **options)
