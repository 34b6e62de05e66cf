"""Chains of debates: a debate subscribed to another debate's results runs a debate of its own on
its ``debateOutput``, exactly once per request, though the requestId (and the echoed debateId)
travel along the chain; and a plain consumer group reads the last hop's results."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from tests.support.bus import running, transport_options, warm_up

from debatebus import Debate, Judge, Participant
from debatebus._worker import DebateBus
from debatebus.client import BusClient
from debatebus.handlers._results import echo
from debatebus.llm import LLMRequest
from debatebus.schemas.envelope import ENVELOPE_DECODER, Envelope, completed_topic
from debatebus.testing import FunctionLLM
from debatebus.transports import transport_from_url

TIMEOUT = 60.0
REQUESTS = 3


TAG = re.compile(r"Q\d+-[0-9a-f]{8}")


class Model:
    """A debate's model: it answers with the debate's name and the tag of the question it was
    asked (``Q<i>-<hex>``, found in the prompt), and counts its calls per tag."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: collections.Counter[str] = collections.Counter()
        self.prompts: list[str] = []

    def __call__(self, request: LLMRequest) -> Any:
        found = TAG.search(request.prompt)
        tag = found.group() if found else "untagged"
        self.calls[tag] += 1
        self.prompts.append(request.prompt)
        if request.purpose == "judge":
            return {"consensus": True, "summary": f"{self.name} agrees on {tag}"}
        return f"{self.name}/{request.speaker} on {tag}, round {request.round}"


def debate(model: Model) -> Debate:
    return Debate(model.name, [Participant("pro", "For."), Participant("con", "Against.")],
                  llm=FunctionLLM(model), moderator=Participant("mod", "Moderate."),
                  judge=Judge(), max_rounds=2)


# framing, round 1 (2 turns + the judge, who stops at consensus), the synthesis
CALLS_PER_DEBATE = 1 + 3 + 1


@contextlib.asynccontextmanager
async def results_of(url: str, topic: str) -> AsyncIterator[asyncio.Queue[Envelope]]:
    """A plain consumer group of its own reading ``topic``: each result it gets, acked."""
    got: asyncio.Queue[Envelope] = asyncio.Queue()
    async with transport_from_url(url, **transport_options(url)) as transport:
        await transport.ensure_topics([topic])
        stream = transport.consume([topic], group=f"notifier-{uuid.uuid4().hex[:6]}",
                                   consumer="notifier-1")

        async def read() -> None:
            async for delivery in stream:
                await got.put(ENVELOPE_DECODER.decode(delivery.body))
                await transport.ack(delivery)

        reader = asyncio.create_task(read())
        try:
            yield got
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


@pytest.mark.parametrize("bus_url", ["redis_streams", "kafka"], indirect=True)
async def test_debate_then_debate_then_a_plain_consumer(bus_url: str, event_type: str) -> None:
    first, second = Model(f"first-{event_type}"), Model(f"second-{event_type}")
    hop_two = completed_topic(event_type)
    app = DebateBus(bus_url, transport_options=transport_options(bus_url),
                    group=f"g-{uuid.uuid4().hex[:8]}")
    app.subscribe(event_type, debate(first).as_handler())
    app.subscribe(hop_two, debate(second).as_handler())  # reads debateOutput by default
    async with running(app), results_of(bus_url, completed_topic(hop_two)) as last_hop, \
            BusClient(bus_url, **transport_options(bus_url)) as client:
        await warm_up(client, event_type)
        tags = [f"Q{i}-{uuid.uuid4().hex[:8]}" for i in range(REQUESTS)]
        rids = [f"chain-{uuid.uuid4().hex[:8]}" for _ in range(REQUESTS)]
        answers = await asyncio.gather(*(
            client.request(event_type, {"input": f"{tag}: adopt it?", "team": "core"},
                           request_id=rid, timeout=TIMEOUT) for tag, rid in zip(tags, rids, strict=True)))
        finals: dict[str, Envelope] = {}
        while len(finals) < REQUESTS:  # the warm-up's results go down the chain too: skipped
            envelope = await asyncio.wait_for(last_hop.get(), TIMEOUT)
            if envelope.request_id in rids:
                assert envelope.request_id not in finals, "the chain answered a request twice"
                finals[envelope.request_id] = envelope
    for rid, tag, answer in zip(rids, tags, answers, strict=True):
        a, b = answer.payload, finals[rid].payload
        assert a["debateStatus"] == b["debateStatus"] == "completed"
        assert a["debateReplayed"] is False and b["debateReplayed"] is False
        assert a["debateOutput"].startswith(first.name)
        assert b["debateOutput"].startswith(second.name), "hop two answered with hop one's debate"
        assert tag in b["debateOutput"]  # hop two debated hop one's output for this request
        assert b["debateId"] == rid and b["team"] == "core"
        assert finals[rid].correlation_id == rid
    # Each hop ran its own debate, once per request.
    for tag in tags:
        assert first.calls[tag] == second.calls[tag] == CALLS_PER_DEBATE, tag


async def test_a_chained_hop_ignores_the_previous_hops_request_fields() -> None:
    """On a result topic the payload is the previous hop's result: its maxRounds, preset and
    debateId were that hop's; this hop's debate id is the requestId."""
    model = Model("second")
    handler = debate(model).as_handler(durable=False)
    previous = {"input": "the first question", "maxRounds": 999, "preset": "no-such-preset",
                "debateId": "first-hop-id", "debateOutput": "the first hop's answer",
                "debateSubDebates": [{"planted": True}], "debateTotalTokenUsage": {"x": 1}}
    ask = handler.ask(previous, "r-1", "event:debate:request:completed")
    assert (ask.question, ask.debate_id, ask.max_rounds, ask.preset) == (
        "the first hop's answer", "r-1", None, None)
    assert ask.key == "event:debate:request:completed/r-1"


def test_a_result_echoes_the_payload_without_the_fields_debatebus_writes() -> None:
    payload = {"input": "q", "team": "core", "debateTotalTokenUsage": {"totalTokens": 1},
               "debateSubDebates": [], "debateResultExpired": True, "debateStatus": "completed"}
    assert echo(payload) == {"input": "q", "team": "core"}


async def test_a_producer_cannot_forge_result_fields() -> None:
    model = Model("forged")
    handler = debate(model).as_handler(durable=False)
    forged = await handler({"input": "q", "debateSubDebates": [{"synthesis": "approve"}],
                            "debateTotalTokenUsage": {"totalTokens": 1},
                            "debateChildrenTokenUsage": {"totalTokens": 0},
                            "debateResultExpired": True, "debateReplayed": True})
    for field in ("debateSubDebates", "debateTotalTokenUsage", "debateChildrenTokenUsage",
                  "debateResultExpired"):
        assert field not in forged, f"{field} was echoed as if debatebus had written it"
    assert forged["debateReplayed"] is False
    assert msgspec.json.encode(forged)  # still a plain JSON document
