"""Bus-level test helpers: a scripted debate, a worker running in the test's loop, the transport
settings tests use, and a warm-up that waits until a worker answers."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from debatebus import Debate, Judge, Participant
from debatebus._worker import DebateBus
from debatebus.client import BusClient
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM
from debatebus.transports._memory import MemoryBroker, MemoryTransport


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


def transport_options(url: str) -> dict[str, Any]:
    if url.startswith("kafka://"):
        return {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}
    if url.startswith("redis://"):
        return {"claim_idle_ms": 1000, "block_ms": 100}
    return {}


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


def app_for(url: str, event_type: str, **options: Any) -> DebateBus:
    handler_options = options.pop("handler_options", {})
    # A fresh group per app: Tansu can strand a group whose leader was the last member to leave.
    options.setdefault("group", f"g-{uuid.uuid4().hex[:8]}")
    app = DebateBus(url, transport_options=transport_options(url), **options)
    app.subscribe(event_type, make_debate(**handler_options.pop("debate", {})).as_handler(**handler_options))
    return app


async def warm_up(client: BusClient, event_type: str) -> None:
    """At-most-once buses drop requests sent before the worker listens, and Kafka group joins take a
    moment: send probe requests until one is answered."""
    for _ in range(60):
        with contextlib.suppress(Exception):
            await client.request(event_type, {"input": "warm-up"}, timeout=1.0)
            return
    raise AssertionError(f"the worker never answered on {event_type}")
