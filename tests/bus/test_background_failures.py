"""Background tasks that meet an exception they did not expect: the Kafka fetch loop, the lease
keeper's renewals and a client's result listener. Each is logged with its traceback, then the
loop runs again, or what waits on it is woken with an error saying what stopped; nothing waits
forever (every wait here is bounded well below the timeouts it would otherwise hang to)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from tests.support.bus import running, transport_options

import debatebus.client
from debatebus._worker import DebateBus
from debatebus.client import BusClient
from debatebus.exceptions import DebatebusError, TransportError
from debatebus.handlers._leases import LeaseKeeper
from debatebus.schemas.envelope import completed_topic
from debatebus.transports import Outgoing
from debatebus.transports._memory import MemoryBroker, MemoryTransport
from debatebus.transports.kafka._group import Member

BOUND_S = 20.0  # what a test waits at most; a hang shows as this timing out


def died_logged(caplog: pytest.LogCaptureFixture, what: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if what in r.getMessage() and r.levelno == logging.ERROR and r.exc_info is not None
            and "unexpected" in str(r.exc_info[1])]


async def echo(payload: Mapping[str, Any]) -> dict[str, Any]:
    return {**payload, "debateStatus": "completed"}


def kafka_app(url: str, event_type: str) -> DebateBus:
    app = DebateBus(url, group=f"g-{uuid.uuid4().hex[:8]}", concurrency=2,
                    transport_options=transport_options(url), heartbeat_interval_s=None)
    app.subscribe(event_type, echo)
    return app


# ---- the Kafka fetch loop -------------------------------------------------------------------


async def test_the_kafka_fetch_loop_recovers_from_an_unexpected_error(
        tansu_server: Any, event_type: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    url = tansu_server.url
    poll = Member._poll_once
    armed, raised = asyncio.Event(), asyncio.Event()

    async def poll_once(member: Member) -> None:
        if armed.is_set() and not raised.is_set():
            raised.set()
            raise RuntimeError("unexpected: a bug in the poll")
        await poll(member)

    monkeypatch.setattr(Member, "_poll_once", poll_once)
    async with running(kafka_app(url, event_type)), \
            BusClient(url, **transport_options(url)) as client:
        first = await client.request(event_type, {"input": "before"}, timeout=BOUND_S)
        armed.set()
        await asyncio.wait_for(raised.wait(), BOUND_S)  # the next request comes after the error
        second = await client.request(event_type, {"input": "after"}, timeout=BOUND_S)

    assert [first.payload["input"], second.payload["input"]] == ["before", "after"]
    (logged,) = died_logged(caplog, "the Kafka fetch loop of group")
    assert "running it again" in logged.getMessage()


async def test_a_kafka_fetch_loop_that_keeps_failing_stops_the_worker(
        tansu_server: Any, event_type: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    async def poll_once(member: Member) -> None:
        raise RuntimeError("unexpected: a bug in every poll")

    monkeypatch.setattr(Member, "_poll_once", poll_once)
    app = kafka_app(tansu_server.url, event_type)
    async with app:
        with pytest.raises(DebatebusError, match=r"fetch loop of group .* stopped") as raised:
            await asyncio.wait_for(app.run(), BOUND_S)
    assert not isinstance(raised.value, TransportError)  # not an outage to wait out: it stops
    assert "stopped after failing" in died_logged(caplog, "the Kafka fetch loop")[-1].getMessage()


# ---- the lease keeper -----------------------------------------------------------------------


class Store:
    """Renews every lease; counts renewals, and can be made to raise what no store should."""

    def __init__(self) -> None:
        self.renewals = 0
        self.renewed = asyncio.Event()
        self.broken = False

    async def renew_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        if self.broken:
            raise RuntimeError("unexpected: a bug in the store")
        self.renewals += 1
        self.renewed.set()
        return True


async def test_the_lease_keeper_renews_again_after_an_unexpected_error(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    store = Store()
    keeper = LeaseKeeper(store, ttl_s=0.3)  # type: ignore[arg-type]  # renew_lease is all it uses
    renew_all = keeper._renew_all
    failed = asyncio.Event()

    async def once_broken(held: Any) -> None:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("unexpected: a bug in a round of renewals")
        await renew_all(held)

    monkeypatch.setattr(keeper, "_renew_all", once_broken)
    run = asyncio.create_task(asyncio.sleep(60))
    keeper.track("owner", "debate", run)
    try:
        await asyncio.wait_for(failed.wait(), BOUND_S)
        await asyncio.wait_for(store.renewed.wait(), BOUND_S)  # renewing again
    finally:
        keeper.untrack("owner")
        run.cancel()
    assert store.renewals >= 1 and not keeper.lost
    (logged,) = died_logged(caplog, "the lease keeper's renewals")
    assert "running it again" in logged.getMessage()


async def test_leases_that_cannot_be_renewed_any_more_stop_their_runs(
        caplog: pytest.LogCaptureFixture) -> None:
    store = Store()
    store.broken = True
    keeper = LeaseKeeper(store, ttl_s=0.3)  # type: ignore[arg-type]  # renew_lease is all it uses
    runs = [asyncio.create_task(asyncio.sleep(60)) for _ in range(3)]
    for n, run in enumerate(runs):
        keeper.track(f"owner-{n}", f"debate-{n}", run)
    done, _ = await asyncio.wait(runs, timeout=BOUND_S)
    assert done == set(runs) and all(run.cancelled() for run in runs)
    assert all(keeper.untrack(f"owner-{n}") for n in range(3))  # each told its lease was lost
    assert "stopped after failing" in died_logged(caplog, "the lease keeper")[-1].getMessage()


# ---- the worker's heartbeat -----------------------------------------------------------------


class Beating(MemoryTransport):
    """A memory transport that keeps heartbeats, the first of which raises what none should."""

    def __init__(self) -> None:
        super().__init__(MemoryBroker())
        self.calls = 0
        self.beaten = asyncio.Event()

    async def write_heartbeat(self, group: str, consumer: str, beat: bytes, *,
                              interval_s: float, last: bool = False) -> None:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("unexpected: a bug in the heartbeat")
        self.beaten.set()


async def test_the_heartbeat_beats_again_after_an_unexpected_error(
        event_type: str, caplog: pytest.LogCaptureFixture) -> None:
    transport = Beating()
    app = DebateBus(transport, heartbeat_interval_s=0.05)
    app.subscribe(event_type, echo)
    async with running(app):
        await asyncio.wait_for(transport.beaten.wait(), BOUND_S)
    (logged,) = died_logged(caplog, "the worker's heartbeat")
    assert "running it again" in logged.getMessage()


# ---- a client's result listener -------------------------------------------------------------


async def test_a_result_listener_that_dies_wakes_its_waiters_with_what_stopped(
        event_type: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    broker = MemoryBroker()
    requests = await MemoryTransport(broker).subscribe([event_type])

    async def answer_with_anything() -> None:  # a stand-in worker: any message on the topic
        async for request in requests:
            await MemoryTransport(broker).publish(Outgoing(completed_topic(event_type), b"{}",
                                                           key=request.key))
            return

    def decode(delivery: Any) -> None:
        raise RuntimeError("unexpected: a bug in decoding")

    monkeypatch.setattr(debatebus.client, "_decode", decode)
    worker = asyncio.create_task(answer_with_anything())
    async with BusClient(MemoryTransport(broker)) as client:
        with pytest.raises(TransportError, match=f"the result listener for {event_type} stopped: "
                                                 "RuntimeError.*unexpected"):
            await asyncio.wait_for(client.request(event_type, {"input": "q"}, timeout=300),
                                   BOUND_S)
    await worker
    assert died_logged(caplog, f"the result listener for {event_type}")
