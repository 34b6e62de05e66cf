"""The testing helpers users get: a debate on an in-memory bus, no Redis, no key."""

from __future__ import annotations

import asyncio

from debatebus import Debate, Judge, Participant
from debatebus.testing import DebateTestBus, ScriptedLLM


async def test_debate_test_bus_round_trip_events_and_dead_letters() -> None:
    llm = ScriptedLLM(["framing", "for", "against", {"consensus": True, "summary": "agreed"},
                       "synthesis"])
    debate = Debate("t", [Participant("a", "A"), Participant("b", "B")], llm=llm,
                    moderator=Participant("m", "M"), judge=Judge())
    async with DebateTestBus(debate) as bus:
        result = await bus.request("Should we?", request_id="r-1")
        await bus.publish_raw(b"not json")
        for _ in range(100):
            if bus.dead_letters():
                break
            await asyncio.sleep(0.01)
        events = bus.events("r-1")
        dead = bus.dead_letters()
    assert result.payload["debateStatus"] == "completed"
    assert result.payload["debateOutput"] == "synthesis"
    assert llm.remaining == 0
    assert events[0].kind == "debate_started"
    assert events[-1].kind == "debate_completed"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len(dead) == 1
    assert dead[0].body == b"not json"
    assert "not valid JSON" in dead[0].headers["x-debatebus-reason"]
