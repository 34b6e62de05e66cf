"""A worker SIGKILLed while it streams a turn: the worker that resumes the debate streams that turn
again from its start, marked as a re-run, and its deltas rebuild exactly the committed text."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from tests.support.bus import transport_options
from tests.support.processes import WorkerProcess, env_for
from tests.support.servers import RedisServer

from debatebus.client import BusClient
from debatebus.schemas import events as ev

pytestmark = [pytest.mark.slow, pytest.mark.redis]

TIMEOUT = 120.0


async def next_event(events: asyncio.Queue[ev.BusEvent]) -> ev.BusEvent:
    return await asyncio.wait_for(events.get(), TIMEOUT)


async def test_a_turn_cut_off_by_a_sigkill_is_streamed_again_marked_as_a_rerun(
        redis_server: RedisServer, tmp_path: Path) -> None:
    url, event_type = redis_server.url, f"debate:req{uuid.uuid4().hex[:6]}"
    events_topic = f"debate:events:{uuid.uuid4().hex[:6]}"
    # 60 words 30 ms apart: each turn takes about 2 s to write.
    env = env_for(url, event_type, tmp_path, DBB_PUBLISH_EVENTS="1", DBB_STREAM_TURNS="1",
                  DBB_WORDS="60", DBB_STREAM_PAUSE="0.03", DBB_LEASE_TTL="2", DBB_ROUNDS="2")
    env["DBB_EVENTS_TOPIC"] = events_topic
    workers: list[WorkerProcess] = []
    async with BusClient(url, **transport_options(url)) as client:
        subscription = await client.transport.subscribe([events_topic])
        queue: asyncio.Queue[ev.BusEvent] = asyncio.Queue()

        async def pump() -> None:
            async for delivery in subscription:
                queue.put_nowait(ev.BUS_EVENT_DECODER.decode(delivery.body))

        pumping = asyncio.create_task(pump())
        try:
            results = await client.results(event_type)
            workers.append(WorkerProcess(env, tmp_path / "first.log"))
            await client.publish(event_type, {"input": "Tabs or spaces?"}, request_id="victim")
            # The first worker is half-way through the optimist's round-1 turn: kill it there.
            before: list[ev.BusEvent] = []
            while True:
                event = await next_event(queue)
                before.append(event)
                if (isinstance(event, ev.TurnDelta) and (event.round, event.speaker) == (1, "optimist")
                        and event.seq >= 3):
                    break
            workers[0].kill()
            cut = (event.round, event.speaker, event.purpose)
            workers.append(WorkerProcess(env, tmp_path / "second.log"))
            after: list[ev.BusEvent] = []
            while not (after and isinstance(after[-1], ev.DebateCompleted)):
                after.append(await next_event(queue))
            result = await asyncio.wait_for(anext(results), TIMEOUT)
        finally:
            pumping.cancel()
            for worker in workers:
                worker.stop()

    assert result.payload["debateStatus"] == "completed"
    cut_before = [e for e in before if isinstance(e, ev.TurnDelta)
                  and (e.round, e.speaker, e.purpose) == cut]
    assert not any(d.final for d in cut_before) and not any(d.rerun for d in cut_before)
    # The resumed run writes the turn again: from seq 1, replacing what was there, as a re-run.
    again = [e for e in after if isinstance(e, ev.TurnDelta)
             and (e.round, e.speaker, e.purpose) == cut and e.rerun]
    assert again, [type(e).__name__ for e in after]
    assert (again[0].seq, again[0].replace) == (1, True)
    assert [d.seq for d in again] == list(range(1, len(again) + 1))
    assert again[-1].final and not any(d.final for d in again[:-1])
    text = ""
    for delta in again:
        text = delta.text if delta.replace else text + delta.text
    (reported,) = [e for e in after if isinstance(e, ev.TurnCompleted)
                   and (e.round, e.speaker) == cut[:2]]
    committed = result.payload["debateTranscript"][0]["turns"][0]
    assert text == reported.text == committed["text"]
    assert committed["speaker"] == "optimist"
