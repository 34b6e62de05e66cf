"""An observer that raises (``DebateBus.add_observer`` takes any user code) changes nothing about
how a request is settled: every request is answered, nothing stays pending or uncommitted, and
the error is logged once per observer and hook, not once per request."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as redis_asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition
from tests.support.bus import make_debate, running, transport_options

from debatebus._worker import DebateBus
from debatebus.client import BusClient
from debatebus.handlers._contract import HandlerResult
from debatebus.observability._observer import Observer, RequestContext, Settlement, fan_out
from debatebus.schemas.events import DebateEvent
from debatebus.transports.kafka import kafka_topic

REQUESTS = 3
WAIT_S = 20.0
HOOKS = ["request_started", "debate_event", "request_finished"]


class Broken(Observer):
    """Raises in one hook, every time it is called; counts the calls."""

    def __init__(self, hook: str) -> None:
        self.hook = hook
        self.calls = 0

    def _maybe_raise(self, hook: str) -> None:
        if hook == self.hook:
            self.calls += 1
            raise RuntimeError(f"observer bug in {hook}")

    def request_started(self, ctx: RequestContext) -> None:
        self._maybe_raise("request_started")

    def debate_event(self, ctx: RequestContext, event: DebateEvent) -> None:
        self._maybe_raise("debate_event")

    def request_finished(self, ctx: RequestContext, outcome: Settlement,
                         result: HandlerResult | None, duration_s: float) -> None:
        self._maybe_raise("request_finished")


class Counting(Observer):
    """A well-behaved observer next to the broken one: it still sees every request."""

    def __init__(self) -> None:
        self.finished: list[Settlement] = []

    def request_finished(self, ctx: RequestContext, outcome: Settlement,
                         result: HandlerResult | None, duration_s: float) -> None:
        self.finished.append(outcome)


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"still not {what} after {WAIT_S} s")
        await asyncio.sleep(0.1)


async def nothing_pending(url: str, event_type: str, group: str) -> bool:
    if url.startswith("kafka://"):
        reader = AIOKafkaConsumer(bootstrap_servers=url.removeprefix("kafka://"), group_id=group,
                                  enable_auto_commit=False)
        await reader.start()
        try:
            name = kafka_topic(event_type)
            # Each partition's log starts at 0, so the committed offsets add up to the records
            # settled in order. (Tansu's end offsets count a batch of two records as one.)
            return sum([await reader.committed(tp) or 0
                        for tp in await _partitions(reader, name)]) == REQUESTS
        finally:
            await reader.stop()
    probe = redis_asyncio.Redis.from_url(url)
    try:
        return int((await probe.xpending(event_type, group))["pending"]) == 0
    finally:
        await probe.aclose()


async def _partitions(reader: AIOKafkaConsumer, name: str) -> list[TopicPartition]:
    await reader.topics()  # loads the metadata
    return [TopicPartition(name, p) for p in sorted(reader.partitions_for_topic(name) or ())]


@pytest.mark.parametrize("bus_url", ["redis_streams", "kafka"], indirect=True)
@pytest.mark.parametrize("hook", HOOKS)
async def test_an_observer_that_raises_changes_nothing_and_is_logged_once(
        bus_url: str, event_type: str, hook: str, caplog: pytest.LogCaptureFixture) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    broken, counting = Broken(hook), Counting()
    app = DebateBus(bus_url, group=group, transport_options=transport_options(bus_url))
    app.subscribe(event_type, make_debate().as_handler(durable=False))
    app.add_observer(broken)
    app.add_observer(counting)
    caplog.set_level(logging.ERROR, logger="debatebus")
    async with running(app), BusClient(bus_url, **transport_options(bus_url)) as client:
        results = await asyncio.gather(*(
            client.request(event_type, {"input": f"question {n}"},
                           request_id=f"{group}-{n}", timeout=WAIT_S) for n in range(REQUESTS)))
        await eventually(lambda: nothing_pending(bus_url, event_type, group),
                         "every request settled (not pending, offsets committed)")

    assert [r.payload["debateStatus"] for r in results] == ["completed"] * REQUESTS
    assert broken.calls >= REQUESTS  # it raised on every request
    assert counting.finished == ["completed"] * REQUESTS
    logged = [r for r in caplog.records if "observer" in r.getMessage() and hook in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    assert logged[0].exc_info is not None  # with its traceback
    assert "observer bug" in str(logged[0].exc_info[1])


@pytest.mark.parametrize("first", [True, False])
def test_fan_out_calls_every_observer_even_after_one_raised(
        first: bool, caplog: pytest.LogCaptureFixture) -> None:
    broken, counting = Broken("request_finished"), Counting()
    observer = fan_out([broken, counting] if first else [counting, broken])
    assert observer is not None
    ctx = RequestContext("debate:request", "1-0", 1)
    for _ in range(3):
        observer.request_finished(ctx, "completed", None, 0.1)
    assert counting.finished == ["completed"] * 3
    assert broken.calls == 3
    assert len([r for r in caplog.records if "request_finished" in r.getMessage()]) == 1


def test_a_single_observer_is_guarded_too(caplog: pytest.LogCaptureFixture) -> None:
    broken = Broken("request_started")
    observer = fan_out([broken])
    assert observer is not None
    observer.request_started(RequestContext("debate:request", "1-0", 1))
    observer.request_started(RequestContext("debate:request", "2-0", 1))
    assert broken.calls == 2
    assert len([r for r in caplog.records if "request_started" in r.getMessage()]) == 1
