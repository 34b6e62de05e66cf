"""Observers name the kinds of debate event they read, and the engine builds no other: the
logging observer reads two kinds unless DEBUG is on; an observer that reads every kind (or
``debate:events``) gets them all."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from tests.support.bus import make_debate, running

from debatebus._worker import DebateBus
from debatebus.client import BusClient
from debatebus.observability._logs import LoggingObserver
from debatebus.observability._observer import Observer, RequestContext, fan_out
from debatebus.schemas import events as ev
from debatebus.transports._memory import MemoryBroker, MemoryTransport


class Recorder(Observer):
    def __init__(self, kinds: frozenset[type[ev.DebateEvent]] | None) -> None:
        self.kinds = kinds
        self.seen: list[ev.DebateEvent] = []

    def debate_event_types(self) -> frozenset[type[ev.DebateEvent]] | None:
        return self.kinds

    def debate_event(self, ctx: RequestContext, event: ev.DebateEvent) -> None:
        self.seen.append(event)


async def serve_one(observers: list[Observer], **options: Any) -> list[ev.DebateEvent]:
    """One request through a memory bus; the events published on ``debate:events``, if any."""
    broker = MemoryBroker()
    app = DebateBus(MemoryTransport(broker), observers=observers, heartbeat_interval_s=None,
                    **options)
    app.subscribe("debate:request", make_debate().as_handler(durable=False))
    published: list[ev.DebateEvent] = []
    async with running(app), BusClient(MemoryTransport(broker)) as client:
        watching = await client.transport.subscribe(["debate:events"])
        result = await client.request("debate:request", {"input": "Tabs or spaces?"}, timeout=30)
        assert result.payload["debateStatus"] == "completed"
        if options.get("publish_events"):
            async for delivery in watching:
                published.append(ev.EVENT_DECODER.decode(delivery.body))
                if isinstance(published[-1], ev.DebateCompleted):
                    break
    return published


async def test_an_observer_gets_only_the_kinds_it_reads() -> None:
    few = Recorder(frozenset((ev.DebateStarted, ev.DebateCompleted)))
    await serve_one([few])
    assert [type(e) for e in few.seen] == [ev.DebateStarted, ev.DebateCompleted]
    assert [e.seq for e in few.seen] == [1, 2]


async def test_every_kind_is_built_when_one_observer_reads_every_kind() -> None:
    few, every = Recorder(frozenset((ev.DebateStarted,))), Recorder(None)
    await serve_one([few, every])
    kinds = {type(e) for e in every.seen}
    assert {ev.DebateStarted, ev.TurnCompleted, ev.VerdictReached, ev.RoundCompleted,
            ev.DebateCompleted} <= kinds
    assert few.seen == every.seen  # observers are handed every event built; each filters its own


async def test_debate_events_gets_every_kind_whatever_the_observers_read() -> None:
    few = Recorder(frozenset((ev.DebateStarted,)))
    published = await serve_one([few], publish_events=True)
    assert {ev.TurnCompleted, ev.VerdictReached, ev.RoundStarted} <= {type(e) for e in published}


@pytest.mark.parametrize(("level", "reads_all"), [(logging.INFO, False), (logging.DEBUG, True)])
def test_the_logging_observer_reads_two_kinds_unless_debug_is_on(level: int,
                                                                 reads_all: bool) -> None:
    logger = logging.getLogger("debatebus.test-event-types")
    logger.setLevel(level)
    kinds = LoggingObserver(logger).debate_event_types()
    assert (kinds is None) is reads_all
    if kinds is not None:
        assert kinds == {ev.DebateStarted, ev.TurnFailed}
    observers = fan_out([LoggingObserver(logger), Recorder(frozenset((ev.PhiUpdate,)))])
    assert observers is not None
    combined = observers.debate_event_types()
    assert combined is None if reads_all else combined == {ev.DebateStarted, ev.TurnFailed,
                                                           ev.PhiUpdate}
