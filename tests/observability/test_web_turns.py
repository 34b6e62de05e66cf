"""The live page answers a person's turn request, behind an opt-in token: ``POST /api/turns``
exists only with ``answer_token``, takes that token in its header only, and publishes the reply
the debate waits for."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
from tests.support.web import TIMEOUT, TOKEN, serving

from debatebus import Debate, Participant
from debatebus._worker import DebateBus
from debatebus.client import BusClient
from debatebus.engine import HumanParticipant
from debatebus.llm import LLMRequest
from debatebus.schemas.envelope import ENVELOPE_DECODER, completed_topic
from debatebus.schemas.events import EVENT_DECODER, TurnRequested
from debatebus.testing import FunctionLLM
from debatebus.transports._memory import MemoryBroker, MemoryTransport
from debatebus.web import create_app

ANSWER_TOKEN = "answer-turns-token-0123456789"
ANSWERING = {"Authorization": f"Bearer {ANSWER_TOKEN}"}


def reply_fields(**overrides: Any) -> dict[str, Any]:
    return {"eventType": "debate:turn:alice", "turnKey": "d1~turn-1-alice-1",
            "messageId": "a" * 32, "text": "alice: ship it", **overrides}


async def test_without_an_answer_token_the_page_cannot_answer() -> None:
    async with serving(create_app(MemoryTransport(MemoryBroker()))) as base, \
            httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:
        response = await http.post("/api/turns", json=reply_fields(), headers=ANSWERING)
    assert response.status_code in (404, 405)


async def test_an_answer_needs_the_answer_token_in_its_header_and_a_whole_reply() -> None:
    broker = MemoryBroker()
    app = create_app(MemoryTransport(broker), token=TOKEN, answer_token=ANSWER_TOKEN)
    async with serving(app) as base, MemoryTransport(broker) as bus, \
            httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:
        replies = await bus.subscribe([completed_topic("debate:turn:alice")])
        for refused in (await http.post("/api/turns", json=reply_fields()),
                        await http.post("/api/turns", json=reply_fields(),
                                        headers={"Authorization": f"Bearer {TOKEN}"}),
                        await http.post("/api/turns", json=reply_fields(),
                                        params={"token": ANSWER_TOKEN})):
            assert refused.status_code == 401
        for bad in (reply_fields(text=""), reply_fields(messageId=None), ["not", "an object"]):
            response = await http.post("/api/turns", json=bad, headers=ANSWERING)
            assert response.status_code == 400
            assert "eventType, turnKey and messageId" in response.json()["error"]
        assert (await http.post("/api/turns", content=b"{", headers=ANSWERING)).status_code == 400
        sent = await http.post("/api/turns", json=reply_fields(), headers=ANSWERING)
        assert (sent.status_code, sent.json()) == (202, {"published": "d1~turn-1-alice-1"})
        async with asyncio.timeout(TIMEOUT):
            reply = ENVELOPE_DECODER.decode((await anext(replies)).body)
    assert (reply.request_id, reply.causation_id) == ("d1~turn-1-alice-1", "a" * 32)
    assert reply.payload["text"] == "alice: ship it"


async def test_a_person_takes_her_turn_from_the_page() -> None:
    broker, tag = MemoryBroker(), uuid.uuid4().hex[:8]
    debate_type, alice_type = f"debate:{tag}", f"debate:turn:alice:{tag}"
    alice = HumanParticipant("alice", event_type=alice_type, deadline_s=TIMEOUT)

    def model(request: LLMRequest) -> str:
        return f"{request.speaker} in round {request.round}"

    debate = Debate("page", [Participant("optimist", "For."), alice], llm=FunctionLLM(model),
                    max_rounds=1)
    bus = DebateBus(MemoryTransport(broker), publish_events=True)
    bus.subscribe(debate_type, debate.as_handler())
    app = create_app(MemoryTransport(broker), answer_token=ANSWER_TOKEN)
    async with serving(app) as base, bus, BusClient(MemoryTransport(broker)) as client, \
            httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:
        events = await client.transport.subscribe([bus.events_topic])
        worker = asyncio.create_task(bus.run())
        asked = asyncio.create_task(client.request(debate_type, {"input": "Ship it?"},
                                                   timeout=TIMEOUT))
        async with asyncio.timeout(TIMEOUT):
            while not isinstance(event := EVENT_DECODER.decode((await anext(events)).body),
                                 TurnRequested):
                pass
        response = await http.post("/api/turns", headers=ANSWERING, json={
            "eventType": event.event_type, "turnKey": event.turn_key,
            "messageId": event.message_id, "text": "alice: ship it behind a flag"})
        assert response.status_code == 202
        result = await asked
        bus.stop()
        await worker
    (rnd,) = result.payload["debateTranscript"]
    assert [t["text"] for t in rnd["turns"]] == ["optimist in round 1",
                                                 "alice: ship it behind a flag"]
