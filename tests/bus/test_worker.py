"""Request → result through a running worker, on every transport; bad input; events; drain."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
import pytest
import redis.asyncio as redis_asyncio
from tests.support.bus import app_for, make_debate, memory_app, running, transport_options, warm_up
from tests.support.servers import free_port

from debatebus._worker import DebateBus
from debatebus.checkpoints import MemoryCheckpointStore, RedisCheckpointStore
from debatebus.client import BusClient
from debatebus.exceptions import TransportError
from debatebus.handlers._contract import HandlerResult
from debatebus.llm import LLMRequest
from debatebus.observability._logs import LoggingObserver
from debatebus.observability._observer import Observer, RequestContext, Settlement
from debatebus.schemas.events import EVENT_DECODER
from debatebus.testing import FunctionLLM
from debatebus.transports import Delivery, Outgoing, dlq_topic, transport_from_url
from debatebus.transports._memory import MemoryBroker, MemoryTransport

TIMEOUT = 60.0


async def test_round_trip_on_every_transport(bus_url: str, event_type: str) -> None:
    rid = f"r-{uuid.uuid4().hex[:8]}"  # the default store outlives the test on Redis
    async with running(app_for(bus_url, event_type)), \
            BusClient(bus_url, **transport_options(bus_url)) as client:
        await warm_up(client, event_type)
        result = await client.request(
            event_type, {"input": "Should we adopt microservices?", "team": "core"},
            request_id=rid, headers={"traceparent": "00-abc-def-01"}, timeout=TIMEOUT)
    p = result.payload
    assert result.request_id == rid
    assert result.correlation_id == rid
    # Caused by the request message (the client gives each message its own id).
    assert result.causation_id is not None and result.causation_id != rid
    assert result.type == f"event:{event_type}:completed"
    assert result.headers.get("traceparent") == "00-abc-def-01"
    assert p["team"] == "core" and p["input"] == "Should we adopt microservices?"
    assert p["debateStatus"] == "completed"
    assert p["debateRounds"] == 2  # consensus at round 2
    assert p["debateSatisfied"] is True
    assert p["debateVerdict"]["consensus"] is True
    assert p["debateOutput"] == "moderator on round 2: a considered view"
    usage = p["debateTokenUsage"]
    assert usage["totalTokens"] == usage["promptTokens"] + usage["completionTokens"] > 0
    assert [r["number"] for r in p["debateTranscript"]] == [1, 2]
    assert p["debateId"] == rid
    assert p["debateReplayed"] is False


async def test_many_requests_at_once_through_one_client_each_get_their_own_result(
        bus_url: str, event_type: str) -> None:
    """300 requests waiting at once share the client's one subscription to the results. (Each
    had its own: on Redis a connection each, and more than redis-py's pool of 100 failed.)"""
    n = 300
    async with running(app_for(bus_url, event_type, concurrency=64)), \
            BusClient(bus_url, **transport_options(bus_url)) as client:
        await warm_up(client, event_type)
        rids = [f"burst-{uuid.uuid4().hex[:8]}" for _ in range(n)]
        results = await asyncio.gather(*(
            client.request(event_type, {"input": f"question {i}"}, request_id=rid,
                           timeout=TIMEOUT) for i, rid in enumerate(rids)))
        assert [r.request_id for r in results] == rids
        assert [r.payload["input"] for r in results] == [f"question {i}" for i in range(n)]
        assert all(r.payload["debateStatus"] == "completed" for r in results)
        # The shared subscription serves the requests after the burst too.
        again = await client.request(event_type, {"input": "after"}, timeout=TIMEOUT)
        assert again.payload["input"] == "after"


class _SubscriptionDropsOnce(MemoryTransport):
    """Its first subscription breaks at once, as a dropped broker connection would."""

    dropped = False

    async def subscribe(self, topics: Sequence[str]) -> AsyncIterator[Delivery]:
        if self.dropped:
            return await super().subscribe(topics)
        self.dropped = True

        async def broken() -> AsyncIterator[Delivery]:
            raise TransportError("connection dropped")
            yield  # an async generator

        return broken()


async def test_a_dropped_subscription_fails_its_requests_and_the_next_subscribes_anew(
        event_type: str) -> None:
    broker = MemoryBroker()
    app = DebateBus(MemoryTransport(broker))
    app.subscribe(event_type, make_debate().as_handler(durable=False))
    async with running(app), BusClient(_SubscriptionDropsOnce(broker)) as client:
        with pytest.raises(TransportError, match="connection dropped before request r1 was "
                                                 "answered"):
            await client.request(event_type, {"input": "q"}, request_id="r1", timeout=TIMEOUT)
        result = await client.request(event_type, {"input": "q"}, request_id="r2",
                                      timeout=TIMEOUT)
        assert result.request_id == "r2"


async def test_failed_debate_is_published_on_failed(event_type: str) -> None:
    def broken(request: LLMRequest) -> Any:
        if request.purpose == "framing":
            return "framing"
        raise RuntimeError("model down")

    app = app_for("memory://", event_type, handler_options={"debate": {"llm": FunctionLLM(broken)}})
    async with running(app), BusClient("memory://") as client:
        result = await client.request(event_type, {"input": "topic"}, timeout=TIMEOUT)
    assert result.type == f"event:{event_type}:failed"
    p = result.payload
    assert p["debateStatus"] == "failed"
    assert "every participant failed in round 1" in p["debateError"]
    assert p["debateTokenUsage"]["totalTokens"] > 0  # the framing call was paid for


async def test_max_rounds_from_request_never_exceeds_cap(event_type: str) -> None:
    app = app_for("memory://", event_type, handler_options={"debate": {"judge": None, "max_rounds": 3}})
    async with running(app), BusClient("memory://") as client:
        one = await client.request(event_type, {"input": "t", "maxRounds": 1}, timeout=TIMEOUT)
        many = await client.request(event_type, {"input": "t", "maxRounds": 99}, timeout=TIMEOUT)
    assert one.payload["debateRounds"] == 1
    assert many.payload["debateRounds"] == 3


BAD_PAYLOADS = [
    ({"topic": "x"}, "payload.input is missing"),
    ({"input": 42}, "payload.input must be a string"),
    ({"input": "   "}, "payload.input is empty"),
    ({"input": "x" * (64 * 1024 + 1)}, "over the limit of 65536"),
    ({"input": "x", "maxRounds": 0}, "payload.maxRounds must be an integer"),
    ({"input": "x", "replay": "yes"}, 'payload.replay must be "rerun"'),
]


@pytest.mark.parametrize(("payload", "reason"), BAD_PAYLOADS)
async def test_bad_payload_gets_a_failed_event_saying_what_to_fix(
        bus_url: str, event_type: str, payload: dict[str, Any], reason: str) -> None:
    async with running(app_for(bus_url, event_type)), \
            BusClient(bus_url, **transport_options(bus_url)) as client:
        await warm_up(client, event_type)
        result = await client.request(event_type, payload, timeout=TIMEOUT)
        assert result.type == f"event:{event_type}:failed"
        assert reason in result.payload["debateError"]
        assert result.payload["debateStatus"] == "failed"
        # nothing stalls: the next good request is answered
        ok = await client.request(event_type, {"input": "fine"}, timeout=TIMEOUT)
        assert ok.payload["debateStatus"] == "completed"


UNREADABLE = [
    (b"not json at all", "body is not valid JSON"),
    (b'{"payload": {"input": "x"}}', "envelope does not match the schema"),
    (b'["a", "list"]', "envelope does not match the schema"),
    (b"\xff\xfe\x00", "body is not valid JSON"),
]


@pytest.mark.parametrize(("body", "reason"), UNREADABLE)
async def test_unreadable_message_goes_to_dlq_with_original_bytes(
        body: bytes, reason: str, event_type: str) -> None:
    app = app_for("memory://", event_type)
    async with running(app), BusClient("memory://") as client:
        dead = await client.transport.subscribe([dlq_topic(event_type)])
        await client.transport.publish(Outgoing(event_type, body))
        got = await asyncio.wait_for(anext(dead), TIMEOUT)
        assert got.body == body
        assert reason in got.headers["x-debatebus-reason"]
        ok = await client.request(event_type, {"input": "fine"}, timeout=TIMEOUT)
        assert ok.payload["debateStatus"] == "completed"


class _Finished(Observer):
    """Set once a request is dead-lettered, after the observers before it have logged it."""

    def __init__(self) -> None:
        self.dead = asyncio.Event()

    def request_finished(self, ctx: RequestContext, outcome: Settlement,
                         result: HandlerResult | None, duration_s: float) -> None:
        if outcome == "dead_lettered":
            self.dead.set()


@pytest.mark.parametrize("kind", ["memory", "kafka"])
async def test_the_dead_letter_log_line_names_the_topic_as_the_broker_does(
        kind: str, event_type: str, request: pytest.FixtureRequest,
        caplog: pytest.LogCaptureFixture) -> None:
    url = "memory://" if kind == "memory" else request.getfixturevalue("tansu_server").url
    app = app_for(url, event_type)
    finished = _Finished()
    app.add_observer(LoggingObserver())
    app.add_observer(finished)
    async with running(app), BusClient(url, **transport_options(url)) as client:
        await warm_up(client, event_type)
        await client.transport.publish(Outgoing(event_type, b"not json"))
        await asyncio.wait_for(finished.dead.wait(), TIMEOUT)
    (line,) = [r.getMessage() for r in caplog.records if "dead_lettered" in r.getMessage()]
    dlq = f"{event_type}:dlq" if kind == "memory" else f"{event_type.replace(':', '.')}.dlq"
    assert line.endswith(f": moved to {dlq}")


async def test_request_without_payload_but_with_id_gets_failed_event(event_type: str) -> None:
    app = app_for("memory://", event_type)
    async with running(app), BusClient("memory://") as client:
        results = await client.transport.subscribe([f"event:{event_type}:failed"])
        await client.transport.publish(Outgoing(event_type, b'{"requestId": "r-9"}'))
        got = msgspec.json.decode((await asyncio.wait_for(anext(results), TIMEOUT)).body)
    assert got["requestId"] == "r-9"
    assert "envelope does not match the schema" in got["payload"]["debateError"]
    assert "payload" in got["payload"]["debateError"]


async def test_oversized_message_is_refused_with_a_reason(event_type: str) -> None:
    app = app_for("memory://", event_type, max_message_bytes=1000)
    async with running(app), BusClient("memory://") as client:
        result = await client.request(event_type, {"input": "y" * 2000}, timeout=TIMEOUT)
    assert result.type == f"event:{event_type}:failed"
    assert "over the limit of 1000" in result.payload["debateError"]


async def test_debate_events_are_published_in_order(event_type: str) -> None:
    app = app_for("memory://", event_type, publish_events=True)
    async with running(app), BusClient("memory://") as client:
        events = await client.transport.subscribe(["debate:events"])
        result = await client.request(event_type, {"input": "t"}, request_id="ev-1", timeout=TIMEOUT)
        seen = []
        while not seen or seen[-1].kind not in ("debate_completed", "debate_failed"):
            event = EVENT_DECODER.decode((await asyncio.wait_for(anext(events), TIMEOUT)).body)
            if event.request_id == "ev-1":
                seen.append(event)
    assert result.payload["debateStatus"] == "completed"
    assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
    assert seen[0].kind == "debate_started"
    assert sum(e.kind == "turn_completed" for e in seen) == 4


async def test_handler_that_keeps_crashing_is_dead_lettered_after_max_deliveries(event_type: str) -> None:
    calls = 0

    async def crashing(payload: Any) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        raise RuntimeError("bug in handler")

    app = DebateBus("memory://", max_deliveries=3)
    app.subscribe(event_type, crashing)
    async with running(app), BusClient("memory://") as client:
        dead = await client.transport.subscribe([dlq_topic(event_type)])
        await client.publish(event_type, {"input": "t"}, request_id="boom")
        got = await asyncio.wait_for(anext(dead), TIMEOUT)
    assert json.loads(got.body)["requestId"] == "boom"
    assert "delivered 4 times without completing (max_deliveries=3)" in got.headers["x-debatebus-reason"]
    assert calls == 3


async def test_stop_drains_in_flight_debates(event_type: str) -> None:
    started = asyncio.Event()

    async def slow(request: LLMRequest) -> Any:
        started.set()
        await asyncio.sleep(0.3)
        return {"consensus": True, "summary": "ok"} if request.purpose == "judge" else "slow answer"

    app = app_for("memory://", event_type, handler_options={"debate": {"llm": FunctionLLM(slow)}})
    transport = transport_from_url("memory://")
    async with app:
        task = asyncio.create_task(app.run())
        results = await transport.subscribe([f"event:{event_type}:completed"])
        await BusClient(transport).publish(event_type, {"input": "t"}, request_id="drain-1")
        await asyncio.wait_for(started.wait(), TIMEOUT)
        app.stop()  # a debate is in flight: it must finish and be published before run() returns
        await asyncio.wait_for(task, TIMEOUT)
        got = await asyncio.wait_for(anext(results), 5)
    assert json.loads(got.body)["requestId"] == "drain-1"


async def test_worker_connects_its_handlers_store_at_startup_and_closes_it(
        caplog: pytest.LogCaptureFixture) -> None:
    unreachable = RedisCheckpointStore(f"redis://:s3cret@127.0.0.1:{free_port()}/0",
                                       connect_timeout=0.2)
    app = memory_app()
    app.subscribe("debate:request", make_debate().as_handler(store=unreachable))
    # Before taking any request, not in its first debate; an outage at start-up is waited out.
    worker = asyncio.create_task(app.run())
    async with asyncio.timeout(TIMEOUT):
        while not any("cannot connect at start-up" in r.getMessage() for r in caplog.records):
            assert not worker.done()
            await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # several attempts
    app.stop()
    await asyncio.wait_for(worker, TIMEOUT)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "redis-server running" in warnings[0] and "s3cret" not in warnings[0]

    class Tracked(MemoryCheckpointStore):
        opened = closed = 0

        async def connect(self) -> None:
            self.opened += 1

        async def close(self) -> None:
            self.closed += 1

    store = Tracked()
    app = memory_app()
    app.subscribe("debate:a", make_debate().as_handler(store=store))
    app.subscribe("debate:b", make_debate().as_handler(store=store))  # one store, two routes
    async with running(app):
        assert (store.opened, store.closed) == (1, 0)
    assert (store.opened, store.closed) == (1, 1)


async def test_worker_says_at_start_what_it_serves_where(caplog: pytest.LogCaptureFixture) -> None:
    app = DebateBus("memory://", group="g-start", heartbeat_interval_s=None)
    app.subscribe("debate:start-log", make_debate().as_handler())
    with caplog.at_level("INFO", logger="debatebus.worker"):
        async with running(app):
            pass
    lines = [r.getMessage() for r in caplog.records
             if r.levelname == "INFO" and r.getMessage().startswith("serving ")]
    assert len(lines) == 1
    assert lines[0].startswith("serving debate:start-log on memory:// as group g-start (consumer ")


async def test_a_worker_reads_no_request_ahead_of_a_slot_to_run_it(redis_server: Any,
                                                                     event_type: str) -> None:
    """Redis counts every read as a delivery: a worker with all its slots busy must not hold
    further requests (a kill would count one more delivery against each, for nothing, and
    enough kills would dead-letter a request no handler ever ran)."""
    started, release = [], asyncio.Event()

    async def slow(payload: dict[str, Any]) -> dict[str, Any]:
        started.append(payload["input"])
        await release.wait()
        return {"debateOutput": "done"}

    group = f"g-{uuid.uuid4().hex[:8]}"
    app = DebateBus(redis_server.url, group=group, concurrency=3,
                    transport_options=transport_options(redis_server.url))
    app.subscribe(event_type, slow)
    async with BusClient(redis_server.url) as client:
        for n in range(10):
            await client.publish(event_type, {"input": f"q{n}"}, request_id=f"{group}-{n}")
        async with running(app):
            for _ in range(500):
                if len(started) == 3:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # time to read ahead, were it going to
            probe = redis_asyncio.Redis.from_url(redis_server.url)
            pending = await probe.xpending(event_type, group)
            await probe.aclose()
            release.set()
    assert len(started) >= 3
    assert pending["pending"] == 3, pending
