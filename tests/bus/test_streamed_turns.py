"""Streamed turns on real brokers: a handler with ``stream_turns=True`` publishes each turn's text
while it is written, as ``turn_delta`` events on ``debate:events``, and ``BusClient.stream``
follows them. Deltas arrive in order, rebuild exactly the committed text, stop when the turn is
committed, and come no more often than the batching interval allows."""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from typing import Any

import pytest
from tests.support.bus import make_debate, memory_app, running, transport_options

from debatebus._worker import DebateBus
from debatebus.client import BusClient
from debatebus.llm import LLMRequest
from debatebus.schemas import events as ev
from debatebus.testing import FunctionLLM
from debatebus.transports import MemoryTransport

TIMEOUT = 60.0
INTERVAL_S = 0.1
WORDS = 120  # per turn, written 4 ms apart: about half a second


@pytest.fixture(params=["memory", "redis_streams", "kafka"])
def stream_url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "kafka":
        return str(request.getfixturevalue("tansu_server").url)
    return str(request.getfixturevalue("redis_server").url)


def answer(request: LLMRequest) -> Any:
    if request.purpose == "judge":
        return {"consensus": False, "summary": f"after round {request.round}"}
    words = " ".join(f"{request.speaker}-{i}" for i in range(WORDS))
    if (request.speaker, request.round) == ("critic", 2):
        # Opens with its own name and writes the optimist's next line too: the transcript
        # keeps neither, and the name went out in the first delta.
        return f"critic: {words}.\noptimist: I get the last word."
    return words


def streamed_debate() -> Any:
    llm = FunctionLLM(answer, stream_pause_s=0.004)
    return make_debate(llm, max_rounds=2).as_handler(stream_turns=True,
                                                     stream_interval_s=INTERVAL_S)


def app_for(url: str, **options: Any) -> tuple[DebateBus, BusClient]:
    if url == "memory://":
        app = memory_app(publish_events=True, heartbeat_interval_s=None, **options)
        assert isinstance(app.transport, MemoryTransport)
        return app, BusClient(MemoryTransport(app.transport.broker))
    app = DebateBus(url, publish_events=True, transport_options=transport_options(url),
                    heartbeat_interval_s=None, group=f"g-{uuid.uuid4().hex[:6]}", **options)
    return app, BusClient(url, **transport_options(url))


def turn_of(event: ev.BusEvent) -> tuple[int, str] | None:
    """The (round, speaker) a turn's own event reports; a synthesis's round is its deltas'."""
    if isinstance(event, ev.TurnCompleted | ev.TurnFailed):
        return event.round, event.speaker
    if isinstance(event, ev.FramingCompleted):
        return 0, event.speaker
    if isinstance(event, ev.SynthesisCompleted):
        return -1, event.speaker
    return None


def check_deltas(events: list[ev.BusEvent]) -> dict[tuple[int, str], list[ev.TurnDelta]]:
    """Every turn's deltas, checked against the event that reports it: in order from seq 1,
    the first one starting the text, the last one final and right before that event, and
    together exactly its text. Returns them by turn."""
    deltas: dict[tuple[int, str], list[ev.TurnDelta]] = defaultdict(list)
    reported: dict[tuple[int, str], str] = {}
    for event in events:
        if isinstance(event, ev.TurnDelta):
            turn = (-1 if event.purpose == "synthesis" else event.round, event.speaker)
            assert turn not in reported, f"a delta of {turn} after it was reported"
            deltas[turn].append(event)
        elif (turn := turn_of(event)) is not None:
            assert deltas[turn][-1].final, f"{turn} reported before its final delta"
            reported[turn] = event.text  # type: ignore[union-attr]
    assert set(deltas) == set(reported)
    for turn, written in deltas.items():
        assert [d.seq for d in written] == list(range(1, len(written) + 1)), turn
        assert written[0].replace and written[-1].final, turn
        assert not any(d.final for d in written[:-1]), turn
        text = ""
        for delta in written:
            text = delta.text if delta.replace else text + delta.text
        assert text == reported[turn], turn
    return deltas


@pytest.mark.slow
async def test_deltas_rebuild_each_turn_exactly_in_order_within_the_batching_bound(
        stream_url: str) -> None:
    app, client = app_for(stream_url)
    event_type = f"debate:request{uuid.uuid4().hex[:8]}"
    app.subscribe(event_type, streamed_debate())
    async with running(app), client:
        stream = await client.stream(event_type, {"input": "Tabs or spaces?"}, timeout=TIMEOUT)
        async with stream:
            events = [event async for event in stream]
    assert stream.result is not None
    assert stream.result.payload["debateStatus"] == "completed"
    assert {e.request_id for e in events} == {stream.request_id}
    assert isinstance(events[0], ev.DebateStarted)
    assert isinstance(events[-1], ev.DebateCompleted)

    deltas = check_deltas(events)
    # Framing, 2 rounds of 2 turns, the synthesis; the judge's JSON is not streamed.
    assert sorted(deltas) == [(-1, "moderator"), (0, "moderator"), (1, "critic"),
                              (1, "optimist"), (2, "critic"), (2, "optimist")]
    transcript = stream.result.payload["debateTranscript"]
    assert deltas[2, "critic"][0].text.startswith("critic: ")
    assert deltas[2, "critic"][-1].replace  # the text as kept replaces what was sent
    assert transcript[1]["turns"][1]["text"] == f"{' '.join(f'critic-{i}' for i in range(WORDS))}."

    # The bound: a turn's first delta at once, then one a tick at most (the ticks INTERVAL_S
    # apart on the loop's clock: over a call of D s, the first delta's tick and at most
    # floor(D / INTERVAL_S) + 1 more), plus its final one. Each turn had WORDS + 1 pieces:
    # batching is what keeps the count down.
    durations = {turn_of(e): e.duration_ms / 1000 for e in events  # type: ignore[union-attr]
                 if turn_of(e) is not None}
    bounds = {turn: math.floor(durations[turn] / INTERVAL_S) + 3 for turn in deltas}
    for turn, written in deltas.items():
        assert len(written) <= bounds[turn], (turn, len(written), durations[turn])
    delta_count = sum(isinstance(e, ev.TurnDelta) for e in events)
    assert delta_count <= sum(bounds.values())
    assert delta_count < len(deltas) * WORDS / 4


async def test_without_published_events_a_streaming_handler_streams_nothing() -> None:
    app, client = app_for("memory://")
    app.publish_events = False
    app.subscribe("debate:request", streamed_debate())
    async with running(app), client:
        watching = await client.transport.subscribe(["debate:events"])
        result = await client.request("debate:request", {"input": "Tabs?"}, timeout=TIMEOUT)
        await watching.aclose()  # type: ignore[attr-defined]
    assert result.payload["debateStatus"] == "completed"
    assert app.transport.broker.log("debate:events") == []  # type: ignore[attr-defined]


async def test_a_stream_of_a_stored_answer_ends_with_it_at_once() -> None:
    app, client = app_for("memory://")
    app.subscribe("debate:request", streamed_debate())
    async with running(app), client:
        first = await client.stream("debate:request", {"input": "Tabs?"}, request_id="same",
                                    timeout=TIMEOUT)
        async with first:
            ran = [e async for e in first]
        again = await client.stream("debate:request", {"input": "Tabs?"}, request_id="same",
                                    timeout=TIMEOUT)
        async with again:
            replayed = [e async for e in again]
    assert any(isinstance(e, ev.TurnDelta) for e in ran)
    assert replayed == []
    assert again.result is not None and again.result.payload["debateReplayed"] is True
