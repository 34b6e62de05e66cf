"""Test your debates on a bus without Redis, Kafka or an API key.

    async with DebateTestBus(debate) as bus:
        result = await bus.request("Should we adopt microservices?")
        assert result.payload["debateStatus"] == "completed"
        assert bus.events(result.request_id)[-1].kind == "debate_completed"

A worker serves the debate on an in-memory broker with the same ack, redelivery and dead-letter
semantics as Redis Streams; ``ScriptedLLM`` and ``FunctionLLM`` (re-exported here) are the models.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

from debatebus._worker import EVENTS_TOPIC, DebateBus
from debatebus.client import BusClient
from debatebus.engine._debate import Debate
from debatebus.handlers._contract import Handler
from debatebus.llm._fakes import FunctionLLM, ScriptedLLM
from debatebus.schemas.envelope import Envelope
from debatebus.schemas.events import BUS_EVENT_DECODER, BusEvent, DebateEvent, TurnDelta
from debatebus.transports import Outgoing
from debatebus.transports._memory import MemoryBroker, MemoryTransport

__all__ = ["DebateTestBus", "FunctionLLM", "ScriptedLLM"]


class DebateTestBus:
    """A private in-memory broker, a worker serving ``debate`` on it, and a client."""

    def __init__(self, debate: Debate | Handler, *, event_type: str = "debate:request",
                 claim_idle_s: float = 1.0, **bus_options: Any) -> None:
        self.broker = MemoryBroker(claim_idle_s=claim_idle_s)
        self.event_type = event_type
        bus_options.setdefault("publish_events", True)
        bus_options.setdefault("heartbeat_interval_s", None)
        self.app = DebateBus(MemoryTransport(self.broker), **bus_options)
        self.app.subscribe(event_type, debate.as_handler() if isinstance(debate, Debate) else debate)
        self.client = BusClient(MemoryTransport(self.broker))
        self._worker: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        await self.app.connect()
        self._worker = asyncio.create_task(self.app.run())
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.app.stop()
        if self._worker is not None:
            await self._worker
        await self.app.close()

    async def request(self, topic_or_payload: str | Mapping[str, Any], *,
                      request_id: str | None = None, timeout: float = 30.0) -> Envelope:
        """Publish a request and wait for its result envelope."""
        payload = ({"input": topic_or_payload} if isinstance(topic_or_payload, str)
                   else topic_or_payload)
        return await self.client.request(self.event_type, payload, request_id=request_id,
                                         timeout=timeout)

    async def publish_raw(self, body: bytes) -> None:
        """Publish bytes as they are, e.g. to test what a malformed message produces."""
        await self.client.transport.publish(Outgoing(self.event_type, body))

    def events(self, request_id: str | None = None) -> list[DebateEvent]:
        """Debate events published so far (all, or one request's), in order; not turn deltas."""
        return [e for e in self._published(request_id) if not isinstance(e, TurnDelta)]

    def deltas(self, request_id: str | None = None) -> list[TurnDelta]:
        """Turn deltas published so far (all, or one request's), in order: a handler made with
        ``as_handler(stream_turns=True)`` publishes them."""
        return [e for e in self._published(request_id) if isinstance(e, TurnDelta)]

    def _published(self, request_id: str | None) -> list[BusEvent]:
        decoded = [BUS_EVENT_DECODER.decode(m.body) for m in self.broker.log(EVENTS_TOPIC)]
        return [e for e in decoded if request_id is None or e.request_id == request_id]

    def dead_letters(self) -> list[Outgoing]:
        return list(self.broker.log(f"{self.event_type}:dlq"))
