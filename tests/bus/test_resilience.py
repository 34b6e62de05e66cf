"""The worker under broker faults, on the memory transport's fault hooks: settles retried until
they land, consume outages ridden out, released deliveries, too-large results, unreadable bodies,
and the shutdown order."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
from tests.support.bus import make_debate, running
from tests.support.servers import RedisServer

from debatebus._worker import DebateBus
from debatebus.client import BusClient
from debatebus.exceptions import ConfigError, LeaseLostError, TransportError
from debatebus.handlers._results import PAYLOAD_ECHO_LIMIT
from debatebus.llm import LLMRequest
from debatebus.schemas.envelope import completed_topic, failed_topic
from debatebus.testing import FunctionLLM
from debatebus.transports import Delivery, Outgoing, dlq_topic
from debatebus.transports._memory import MemoryBroker, MemoryTransport

TIMEOUT = 30.0
TOPIC = "debate:request"


@pytest.fixture(autouse=True)
def info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="debatebus")


def messages(caplog: pytest.LogCaptureFixture, level: str, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelname == level and needle in r.getMessage()]


def bodies(broker: MemoryBroker, topic: str) -> list[dict[str, Any]]:
    return [json.loads(m.body) for m in broker.log(topic)]


def pending(broker: MemoryBroker) -> int:
    return sum(len(g.pending) for (topic, _), g in broker.groups.items() if topic == TOPIC)


async def wait_until(condition: Any, timeout: float = TIMEOUT) -> None:
    async with asyncio.timeout(timeout):
        while True:
            if condition():
                return
            await asyncio.sleep(0.02)


def bus(broker: MemoryBroker, handler: Any = None, **options: Any) -> DebateBus:
    options.setdefault("heartbeat_interval_s", None)
    app = DebateBus(MemoryTransport(broker), **options)
    app.subscribe(TOPIC, handler or make_debate().as_handler())
    return app


async def publish(broker: MemoryBroker, payload: dict[str, Any], request_id: str) -> None:
    await BusClient(MemoryTransport(broker)).publish(TOPIC, payload, request_id=request_id)


async def test_a_failed_settle_is_retried_until_it_lands_exactly_once(
        caplog: pytest.LogCaptureFixture) -> None:
    broker = MemoryBroker(claim_idle_s=0.5)
    broker.inject("settle", 4)
    # Held, so kept alive by the transport while the settle is retried: it is never handed out a
    # second time.
    async with running(bus(broker)):
        await publish(broker, {"input": "t"}, "retry-1")
        await wait_until(lambda: broker.log(completed_topic(TOPIC)))
        # Acked: nothing pending is left to be claimed and handed out again.
        await wait_until(lambda: pending(broker) == 0)
    assert [b["requestId"] for b in bodies(broker, completed_topic(TOPIC))] == ["retry-1"]
    assert pending(broker) == 0
    assert len(messages(caplog, "WARNING", "could not settle")) == 1  # one line per delivery
    assert messages(caplog, "INFO", "after 4 failed attempts")


async def test_a_retried_ack_that_had_landed_publishes_nothing_twice() -> None:
    """A lost reply: the broker took the ack, the worker retries it; the result exists once."""
    broker = MemoryBroker(claim_idle_s=0.5)

    class LostReply(MemoryTransport):
        lost = 2

        async def ack(self, delivery: Delivery, results: Sequence[Outgoing] = ()) -> None:
            await super().ack(delivery, results)
            if self.lost:
                self.lost -= 1
                broker.inject("settle")  # the retry sees the broker refuse, then succeed
                raise TransportError("connection lost before the reply")

    app = DebateBus(LostReply(broker), heartbeat_interval_s=None)
    app.subscribe(TOPIC, make_debate().as_handler())
    async with running(app):
        await publish(broker, {"input": "t"}, "lost-1")
        await wait_until(lambda: broker.log(completed_topic(TOPIC)))
        # Acked: nothing pending is left to be claimed and handed out again.
        await wait_until(lambda: pending(broker) == 0)
    assert len(broker.log(completed_topic(TOPIC))) == 1
    assert pending(broker) == 0


async def test_consume_outage_is_logged_once_and_in_flight_debates_finish(
        caplog: pytest.LogCaptureFixture) -> None:
    broker = MemoryBroker(claim_idle_s=5.0)
    started, go_on = asyncio.Event(), asyncio.Event()

    async def answer(request: LLMRequest) -> Any:
        started.set()
        await go_on.wait()
        return {"consensus": True, "summary": "ok"} if request.purpose == "judge" else "a view"

    app = bus(broker, make_debate(FunctionLLM(answer)).as_handler())
    async with running(app):
        await publish(broker, {"input": "slow"}, "inflight-1")
        await asyncio.wait_for(started.wait(), TIMEOUT)
        broker.inject("consume", 6)  # the running consumer fails, then five reconnects do
        await wait_until(lambda: not broker._faults.get("consume"))
        go_on.set()  # the debate ran on through the outage
        await publish(broker, {"input": "after"}, "after-1")
        await wait_until(lambda: len(broker.log(completed_topic(TOPIC))) == 2)
    done = {b["requestId"] for b in bodies(broker, completed_topic(TOPIC))}
    assert done == {"inflight-1", "after-1"}
    assert len(messages(caplog, "WARNING", "lost the connection to the broker")) == 1
    assert len(messages(caplog, "INFO", "connected to the broker at MemoryTransport again")) == 1
    assert pending(broker) == 0


async def test_broker_unreachable_at_start_up_is_waited_for(caplog: pytest.LogCaptureFixture) -> None:
    broker = MemoryBroker()
    broker.inject("connect", 3)
    app = bus(broker)
    worker = asyncio.create_task(app.run())  # no ``async with``: run() connects
    try:
        await publish(broker, {"input": "t"}, "late-1")
        await wait_until(lambda: broker.log(completed_topic(TOPIC)))
    finally:
        app.stop()
        await asyncio.wait_for(worker, TIMEOUT)
        await app.close()
    assert len(messages(caplog, "WARNING", "cannot connect at start-up")) == 1
    assert len(messages(caplog, "INFO", "again")) == 1


async def test_misconfiguration_at_start_up_stops_the_worker_at_once() -> None:
    class WrongAuth(MemoryTransport):
        async def connect(self) -> None:
            raise ConfigError("Redis refused the credentials: check the password in the URL")

    app = DebateBus(WrongAuth(MemoryBroker()), heartbeat_interval_s=None)
    app.subscribe(TOPIC, make_debate().as_handler())
    with pytest.raises(ConfigError, match="credentials"):
        await asyncio.wait_for(app.run(), 5)


@pytest.mark.redis
async def test_a_worker_on_a_db_the_server_does_not_have_stops_instead_of_retrying(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    app = DebateBus(redis_server.url.replace("/0", "/99"), heartbeat_interval_s=None)
    app.subscribe("debate:request", make_debate().as_handler())
    try:
        with pytest.raises(ConfigError, match="database 99 does not exist on this server"):
            await asyncio.wait_for(app.run(), 10)
    finally:
        await app.close()
    assert "cannot connect" not in caplog.text


class Recording(MemoryTransport):
    """Remembers what the worker asked of it, in order."""

    def __init__(self, broker: MemoryBroker) -> None:
        super().__init__(broker)
        self.calls: list[str] = []
        self.released: list[tuple[str, int]] = []

    async def consume(self, topics: Sequence[str], *, group: str, consumer: str,
                      prefetch: int = 16) -> AsyncIterator[Delivery]:
        try:
            async for delivery in super().consume(topics, group=group, consumer=consumer,
                                                  prefetch=prefetch):
                yield delivery
        finally:
            self.calls.append("consume ended")

    async def ack(self, delivery: Delivery, results: Sequence[Outgoing] = ()) -> None:
        self.calls.append("ack")
        await super().ack(delivery, results)

    def release(self, delivery: Delivery) -> None:
        self.calls.append(f"release {delivery.id}/{delivery.deliveries}")
        self.released.append((delivery.id, delivery.deliveries))
        super().release(delivery)

    async def close(self) -> None:
        self.calls.append("close")
        await super().close()


async def _answered(broker: MemoryBroker, failing_first: Callable[[], Awaitable[None]],
                    request_id: str) -> tuple[Recording, int]:
    """Serve a handler whose first call runs ``failing_first`` (which raises) until ``request_id``
    is answered; the recording transport and how many calls it took."""
    transport = Recording(broker)
    calls = 0

    async def handler(payload: Any) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            await failing_first()
        return {**payload, "debateStatus": "completed"}

    app = DebateBus(transport, heartbeat_interval_s=None)
    app.subscribe(TOPIC, handler)
    async with running(app):
        await publish(broker, {"input": "t"}, request_id)
        await wait_until(lambda: broker.log(completed_topic(TOPIC)))
    assert [b["requestId"] for b in bodies(broker, completed_topic(TOPIC))] == [request_id]
    assert pending(broker) == 0
    return transport, calls


async def test_lost_lease_releases_the_delivery_for_redelivery() -> None:
    broker = MemoryBroker(claim_idle_s=0.5)
    during: list[int] = []

    async def lose_the_lease() -> None:
        await asyncio.sleep(0.7)  # past claim_idle_s: held, so kept alive by the transport
        during.append(broker.groups[(TOPIC, "debatebus")].pending[0].deliveries)
        raise LeaseLostError("lost the lease on debate 'x': another worker may resume it")

    transport, calls = await _answered(broker, lose_the_lease, "lease-1")
    assert during == [1]  # never handed out again while held
    assert calls == 2  # once released, it is handed out again
    assert transport.released == [("1-0", 1)]


async def test_crash_whose_requeue_fails_is_released() -> None:
    broker = MemoryBroker(claim_idle_s=0.5)

    async def crash() -> None:
        broker.inject("settle")  # the requeue that follows fails
        raise RuntimeError("bug")

    transport, calls = await _answered(broker, crash, "crash-1")
    assert calls == 2
    assert transport.released == [("1-0", 1)]


async def test_result_over_the_broker_limit_becomes_a_failure_event() -> None:
    broker = MemoryBroker(max_message_bytes=8000)

    async def handler(payload: Any) -> dict[str, Any]:
        if payload["input"] == "small":
            return {**payload, "debateStatus": "completed"}
        return {**payload, "debateStatus": "completed", "debateOutput": "x" * 20_000}

    async with running(bus(broker, handler)):
        await publish(broker, {"input": "big", "team": "core"}, "big-1")
        await publish(broker, {"input": "small"}, "small-1")
        await wait_until(lambda: broker.log(failed_topic(TOPIC)) and broker.log(completed_topic(TOPIC)))
    (failure,) = bodies(broker, failed_topic(TOPIC))
    assert failure["requestId"] == "big-1"
    error = failure["payload"]["debateError"]
    assert "result is " in error and "over the broker's limit of 8000" in error
    size = int(error.split("result is ", 1)[1].split(" bytes", 1)[0])
    assert size > 20_000
    assert failure["payload"]["team"] == "core"
    assert [b["requestId"] for b in bodies(broker, completed_topic(TOPIC))] == ["small-1"]
    assert pending(broker) == 0


async def test_failure_events_echo_a_big_payload_only_in_part() -> None:
    broker = MemoryBroker()
    payload = {"input": 42, "team": "core", "blob": "b" * (PAYLOAD_ECHO_LIMIT + 1)}
    async with running(bus(broker)):
        await publish(broker, payload, "echo-1")
        await publish(broker, {"input": 42, "team": "small"}, "echo-2")
        await wait_until(lambda: len(broker.log(failed_topic(TOPIC))) == 2)
    big, small = (b["payload"] for b in bodies(broker, failed_topic(TOPIC)))
    assert "payload.input must be a string" in big["debateError"]
    assert big["team"] == "core" and big["input"] == 42
    assert "blob" not in big
    truncated = big["debatePayloadTruncated"]
    assert truncated["limit"] == PAYLOAD_ECHO_LIMIT
    assert truncated["bytes"] > PAYLOAD_ECHO_LIMIT
    assert truncated["dropped"] == ["blob"]
    assert small["team"] == "small" and "debatePayloadTruncated" not in small
    assert len(broker.log(failed_topic(TOPIC))[0].body) < 32 * 1024


DEEP = 100_000


NESTED = b"[" * DEEP + b"]" * DEEP


@pytest.mark.parametrize(("body", "where", "reason"), [
    (b'{"requestId": "deep-1", "payload": {"input": ' + NESTED + b"}}", "failed", "nests too deeply"),
    # requestId after the deep part: the lenient reader finds it without recursing
    (b'{"payload": {"a": ' + NESTED + b'}, "requestId": "deep-2"}', "failed", "nests too deeply"),
    (b'{"payload": ' + NESTED + b', "requestId": "deep-3"}', "failed", "Expected `object`"),
    (NESTED, "dlq", "Expected `object`"),
    (b'{"payload": {"x": ' + b'{"a": ' * DEEP + b"1" + b"}" * DEEP + b"}}", "dlq", "nests too deeply"),
])
async def test_deeply_nested_json_is_settled_at_once(body: bytes, where: str, reason: str) -> None:
    broker = MemoryBroker(claim_idle_s=0.3)
    calls = 0

    async def handler(payload: Any) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return dict(payload)

    async with running(bus(broker, handler, max_message_bytes=8 * DEEP)):
        await MemoryTransport(broker).publish(Outgoing(TOPIC, body))
        topic = failed_topic(TOPIC) if where == "failed" else dlq_topic(TOPIC)
        await wait_until(lambda: broker.log(topic))
        # Acked: nothing pending is left to be claimed and handed out again.
        await wait_until(lambda: pending(broker) == 0)
    assert calls == 0
    assert len(broker.log(topic)) == 1
    assert pending(broker) == 0
    if where == "failed":
        (event,) = bodies(broker, topic)
        assert event["requestId"].startswith("deep-")
        assert reason in event["payload"]["debateError"]
    else:
        assert reason in broker.log(topic)[0].headers["x-debatebus-reason"]


async def test_empty_request_id_goes_to_the_dlq_with_a_reason() -> None:
    broker = MemoryBroker()
    async with running(bus(broker)):
        await MemoryTransport(broker).publish(
            Outgoing(TOPIC, b'{"requestId": "", "payload": {"input": "t"}}'))
        await wait_until(lambda: broker.log(dlq_topic(TOPIC)))
    (dead,) = broker.log(dlq_topic(TOPIC))
    assert "send a non-empty requestId" in dead.headers["x-debatebus-reason"]
    assert not broker.log(completed_topic(TOPIC))


async def test_shutdown_stops_consuming_drains_settles_then_closes() -> None:
    broker = MemoryBroker(claim_idle_s=5.0)
    transport = Recording(broker)
    started = asyncio.Event()

    async def answer(request: LLMRequest) -> Any:
        started.set()
        await asyncio.sleep(0.3)
        return {"consensus": True, "summary": "ok"} if request.purpose == "judge" else "a view"

    app = DebateBus(transport, heartbeat_interval_s=None)
    app.subscribe(TOPIC, make_debate(FunctionLLM(answer)).as_handler())
    await app.connect()
    worker = asyncio.create_task(app.run())
    await publish(broker, {"input": "t"}, "drain-1")
    await asyncio.wait_for(started.wait(), TIMEOUT)
    broker.inject("settle", 3)  # the drained debate's ack needs retries
    await asyncio.wait_for(app.close(), TIMEOUT)  # close() under a run stops and drains it first
    assert worker.done()
    assert transport.calls[0] == "consume ended"
    assert transport.calls[-1] == "close"
    assert transport.calls.count("ack") == 4
    assert [b["requestId"] for b in bodies(broker, completed_topic(TOPIC))] == ["drain-1"]


async def test_drain_timeout_releases_a_settle_that_never_lands(
        caplog: pytest.LogCaptureFixture) -> None:
    broker = MemoryBroker(claim_idle_s=5.0)
    transport = Recording(broker)
    app = DebateBus(transport, heartbeat_interval_s=None, drain_timeout=0.5)
    app.subscribe(TOPIC, make_debate().as_handler())
    broker.inject("settle", 10_000)
    async with running(app):
        await publish(broker, {"input": "t"}, "stuck-1")
        await wait_until(lambda: messages(caplog, "WARNING", "could not settle"))
    assert transport.released == [("1-0", 1)]
    assert messages(caplog, "WARNING", "gave up settling")
    assert transport.calls[-1] == "close"
    assert not broker.log(completed_topic(TOPIC))
