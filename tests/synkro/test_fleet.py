"""debatebus workers as members of a Synkro fleet, on a real Redis (``redis+pubsub://``).

Synkro's side is played by small scripts of this file written from Synkro's documented wire:
publishers that ``PUBLISH {"requestId", "payload"}``, subscribers that drop a second message of
one requestId on a channel (as Synkro's Redis subscriber does), a handler instance that takes
the lock and dedupe keys the way Synkro's handler registry does, and a workflow orchestrator
that publishes each step on ``workflow:<name>:<step>`` and advances on its completion channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis.asyncio import Redis
from tests.support.bus import make_debate, running

from debatebus._worker import DebateBus
from debatebus.llm import LLMRequest
from debatebus.observability import Observer, RequestContext, Settlement
from debatebus.schemas.result import HandlerResult
from debatebus.testing import FunctionLLM
from debatebus.transports._synkro import (
    SynkroSettings,
    dedupe_key,
    dlq_key,
    lock_key,
    metrics_key,
    step_channel,
)

TIMEOUT = 30.0
SYNKRO_REQUEST_ID = re.compile(r'"requestId":"([^"]+)"')


@pytest.fixture
def url(redis_server: Any) -> str:
    return str(redis_server.url).replace("redis://", "redis+pubsub://")


@pytest.fixture
async def redis(redis_server: Any) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def event_type() -> str:
    return f"debate:synkro{uuid.uuid4().hex[:8]}"


class Runs:
    """An LLM that answers at once and counts debates run (one optimist turn in round 1 each);
    it fails every call of a question that says FAIL."""

    def __init__(self) -> None:
        self.debates = 0

    def __call__(self, request: LLMRequest) -> Any:
        if "FAIL" in str(request.messages):
            raise RuntimeError("model down")
        if request.speaker == "optimist" and request.round == 1:
            self.debates += 1
        if request.purpose == "judge":
            return {"consensus": request.round >= 2, "summary": f"after round {request.round}"}
        return f"{request.speaker} says {request.round}"


def worker(url: str, event_type: str, runs: Runs, *, step: str | None = None,
           **options: Any) -> DebateBus:
    debate_options = options.pop("debate", {})
    app = DebateBus(url, group="g", heartbeat_interval_s=None, **options)
    handler = make_debate(FunctionLLM(runs), **debate_options).as_handler(durable=False)
    if step is None:
        app.subscribe(event_type, handler)
    else:
        app.subscribe_synkro_step(event_type, step, handler)
    return app


async def listening(redis: Redis, channel: str, members: int) -> None:
    """At-most-once: wait until ``members`` subscribers listen on ``channel``."""
    for _ in range(300):
        ((_, count),) = await redis.pubsub_numsub(channel)
        if count >= members:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{members} subscribers never listened on {channel}")


async def publish(redis: Redis, channel: str, request_id: str, payload: Any) -> None:
    """What ``synkro.publish`` sends."""
    await redis.publish(channel, json.dumps({"requestId": request_id, "payload": payload}))


@dataclass
class Watcher:
    """Every message on some channels, in order, as (channel, parsed message); ``synkro_view``
    keeps what a Synkro subscriber would hand its callbacks (first of each requestId)."""

    messages: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    synkro_view: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    _seen: set[tuple[str, str]] = field(default_factory=set)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def take(self, channel: str, data: str) -> None:
        message = json.loads(data)
        self.messages.append((channel, message))
        self._arrived.set()
        match = SYNKRO_REQUEST_ID.search(data)
        key = (channel, match.group(1) if match else data)
        if key not in self._seen:
            self._seen.add(key)
            self.synkro_view.append((channel, message))

    def on(self, channel: str) -> list[dict[str, Any]]:
        return [m for c, m in self.messages if c == channel]

    async def until(self, count: int, channel: str) -> list[dict[str, Any]]:
        async with asyncio.timeout(TIMEOUT):
            while len(self.on(channel)) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.on(channel)


@contextlib.asynccontextmanager
async def watching(redis: Redis, *channels: str) -> AsyncIterator[Watcher]:
    watcher = Watcher()
    pubsub = redis.pubsub()
    await pubsub.subscribe(*channels)

    async def pump() -> None:
        async for message in pubsub.listen():
            if message["type"] == "message":
                watcher.take(message["channel"], message["data"])

    task = asyncio.create_task(pump())
    try:
        yield watcher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await pubsub.aclose()  # type: ignore[no-untyped-call]


async def counters(redis: Redis, event_type: str) -> dict[str, int]:
    names = ("received", "completed", "failed")
    values = await redis.mget([metrics_key(event_type, n) for n in names])  # type: ignore[arg-type]
    return {n: int(v or 0) for n, v in zip(names, values, strict=True)}


class Settled(Observer):
    """Counts the deliveries the workers it observes have settled, however: an answer, or a
    duplicate left alone (no trace on the broker, but the worker's observer sees it settled)."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = asyncio.Event()

    def request_finished(self, ctx: RequestContext, outcome: Settlement,
                         result: HandlerResult | None, duration_s: float) -> None:
        self.count += 1
        self._changed.set()

    async def reach(self, count: int) -> None:
        async with asyncio.timeout(TIMEOUT):
            while self.count < count:
                self._changed.clear()
                await self._changed.wait()


async def answered_and_unlocked(redis: Redis, event_type: str, rids: list[str]) -> None:
    """Wait until every request's dedupe key is set and no lock is held: a second answer would
    need a claim, and from then on every claim finds the request answered (a lock is deleted only
    after its dedupe key is set, so any second answer was published before this returns)."""
    async def settled() -> bool:
        return all([await redis.get(dedupe_key(rid, event_type)) == "1"
                    and not await redis.exists(lock_key(rid, event_type)) for rid in rids])

    for _ in range(int(TIMEOUT / 0.05)):  # the broker's keys, polled: nothing to await on
        if await settled():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"requests not all answered and unlocked within {TIMEOUT} s")


async def test_two_workers_answer_each_request_once_with_one_debate_run(
        url: str, redis: Redis, event_type: str) -> None:
    runs = Runs()
    done = f"event:{event_type}:completed"
    rids = [f"r-{i}-{uuid.uuid4().hex[:6]}" for i in range(6)]
    marker = f"marker:{event_type}"
    settled = Settled()
    async with running(worker(url, event_type, runs, observers=[settled])), \
            running(worker(url, event_type, runs, observers=[settled])), \
            watching(redis, done, marker) as watcher:
        await listening(redis, event_type, 2)
        for rid in rids:
            await publish(redis, event_type, rid, {"input": "Adopt Kafka?", "team": "core"})
        results = await watcher.until(len(rids), done)
        await answered_and_unlocked(redis, event_type, rids)
        # Pub/sub hands one subscriber its messages in publish order: once the watcher has the
        # marker, it has every answer published before it.
        await redis.publish(marker, json.dumps({"marker": 1}))
        await watcher.until(1, marker)
        assert sorted(m["requestId"] for m in watcher.on(done)) == sorted(rids)
        assert runs.debates == len(rids)
        # the same requestId again, within the dedupe TTL: ignored, as Synkro does
        await publish(redis, event_type, rids[0], {"input": "Adopt Kafka?"})
        await settled.reach(2 * (len(rids) + 1))  # both workers settled every message, the copy too
        await redis.publish(marker, json.dumps({"marker": 2}))  # and any answer reached the watcher
        await watcher.until(2, marker)
        assert len(watcher.on(done)) == len(rids)
        assert runs.debates == len(rids)
    assert all(m["payload"]["team"] == "core" for m in results)
    assert await counters(redis, event_type) == {"received": 6, "completed": 6, "failed": 0}
    for rid in rids:
        assert await redis.get(dedupe_key(rid, event_type)) == "1"
        assert 86000 < await redis.ttl(dedupe_key(rid, event_type)) <= 86400
        assert not await redis.exists(lock_key(rid, event_type))


async def synkro_instance(redis: Redis, event_type: str, answered: list[str],
                          ready: asyncio.Event) -> None:
    """One Synkro handler instance, as its handler registry settles a message: dedupe check,
    ``SET lock 1 EX 300 NX``, count, handle (slowly), publish, dedupe, unlock.

    Synkro's check and lock are two commands: an instance that stalls between them can take the
    lock of a request another member answered and released meanwhile, and answer it again.
    debatebus's claim is one script, but it cannot close the other member's window; this stand-in
    checks the dedupe key again once it holds the lock, so the test counts debatebus's side only
    (docs/wire-format.md, "Mixed fleets")."""
    pubsub = redis.pubsub()
    await pubsub.subscribe(event_type)
    ready.set()
    try:
        async for message in pubsub.listen():
            if message["type"] != "message":
                continue
            event = json.loads(message["data"])
            rid = event["requestId"]
            if await redis.get(dedupe_key(rid, event_type)) == "1":
                continue
            if not await redis.set(lock_key(rid, event_type), "1", ex=300, nx=True):
                continue
            if await redis.get(dedupe_key(rid, event_type)) == "1":  # answered meanwhile
                await redis.delete(lock_key(rid, event_type))
                continue
            await redis.incr(metrics_key(event_type, "received"))
            await asyncio.sleep(0.05)
            answered.append(rid)
            payload = {**event["payload"], "debateOutput": "from synkro", "debateStatus": "completed"}
            await redis.publish(f"event:{event_type}:completed",
                                json.dumps({"requestId": rid, "payload": payload}))
            await redis.incr(metrics_key(event_type, "completed"))
            await redis.set(dedupe_key(rid, event_type), "1", ex=86400)
            await redis.delete(lock_key(rid, event_type))
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]


async def test_a_synkro_instance_and_a_debatebus_worker_answer_each_request_once(
        url: str, redis: Redis, event_type: str) -> None:
    runs, by_synkro, ready = Runs(), list[str](), asyncio.Event()
    done = f"event:{event_type}:completed"
    rids = [f"m-{i}-{uuid.uuid4().hex[:6]}" for i in range(8)]
    held, answered_before = f"held-{uuid.uuid4().hex[:6]}", f"old-{uuid.uuid4().hex[:6]}"
    member = asyncio.create_task(synkro_instance(redis, event_type, by_synkro, ready))
    settled, marker = Settled(), f"marker:{event_type}"
    try:
        async with running(worker(url, event_type, runs, observers=[settled])), \
                watching(redis, done, marker) as watcher:
            await ready.wait()
            await listening(redis, event_type, 2)
            for rid in rids:
                await publish(redis, event_type, rid, {"input": "Monolith?"})
            await watcher.until(len(rids), done)
            await settled.reach(len(rids))  # the worker settled (answered or left) every one
            # Keys another member wrote: a lock it holds, a request it answered.
            await redis.set(lock_key(held, event_type), "1", ex=300)
            await redis.set(dedupe_key(answered_before, event_type), "1", ex=86400)
            member.cancel()  # from here the debatebus worker is alone on the channel
            await publish(redis, event_type, held, {"input": "Monolith?"})
            await publish(redis, event_type, answered_before, {"input": "Monolith?"})
            await settled.reach(len(rids) + 2)  # both left alone: no trace but the settling
            await redis.publish(marker, json.dumps({"marker": 1}))
            await watcher.until(1, marker)
            assert len(watcher.on(done)) == len(rids)
            await redis.delete(lock_key(held, event_type))  # its holder let go without answering
            await publish(redis, event_type, held, {"input": "Monolith?"})
            await watcher.until(len(rids) + 1, done)
    finally:
        member.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await member
    answered = [m["requestId"] for m in watcher.on(done)]
    assert sorted(answered) == sorted([*rids, held])
    assert runs.debates + len(by_synkro) == len(rids) + 1
    assert (await counters(redis, event_type))["received"] == len(rids) + 1


async def test_failures_take_synkros_shapes_counters_and_dead_letter_list(
        url: str, redis: Redis, event_type: str) -> None:
    runs = Runs()
    done, failed = f"event:{event_type}:completed", f"event:{event_type}:failed"
    async with running(worker(url, event_type, runs)), watching(redis, done, failed) as watcher:
        await listening(redis, event_type, 1)
        await publish(redis, event_type, "bad-type", "just a string")
        await publish(redis, event_type, "bad-input", {"input": 42, "team": "core"})
        await publish(redis, event_type, "model-down", {"input": "FAIL please"})
        failures = await watcher.until(2, failed)
        (model_down,) = await watcher.until(1, done)
    by_id = {m["requestId"]: m for m in failures}
    assert by_id["bad-type"]["payload"] == "just a string"
    sent = by_id["bad-input"]["payload"]
    assert {k: sent[k] for k in ("input", "team")} == {"input": 42, "team": "core"}
    assert sent["debateStatus"] == "failed"  # debatebus's failure fields beside the payload's
    for message in failures:
        (error,) = message["errors"]
        assert error["name"] == "InputError" and error["message"]
    assert "payload.input must be a string" in by_id["bad-input"]["errors"][0]["message"]
    assert model_down["requestId"] == "model-down"
    assert model_down["payload"]["debateStatus"] == "failed"
    assert model_down["payload"]["debateOutput"].startswith("LLM call failed: ")
    assert "debateSynthesis" not in model_down["payload"]
    assert await counters(redis, event_type) == {"received": 3, "completed": 1, "failed": 2}
    items = {i["requestId"]: i for i in map(json.loads, await redis.lrange(dlq_key(event_type), 0, -1))}
    assert set(items) == {"bad-type", "bad-input"}
    item = items["bad-input"]
    assert set(item) == {"eventType", "requestId", "payload", "errors", "failedAt", "attempts"}
    assert item["eventType"] == event_type and item["attempts"] == 1
    assert item["payload"] == {"input": 42, "team": "core"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", item["failedAt"])


async def test_a_debate_without_moderator_outputs_the_last_rounds_texts(
        url: str, redis: Redis, event_type: str) -> None:
    done = f"event:{event_type}:completed"
    app = worker(url, event_type, Runs(), debate={"moderator": None})
    async with running(app), watching(redis, done) as watcher:
        await listening(redis, event_type, 1)
        await publish(redis, event_type, "plain", {"input": "Adopt Kafka?"})
        (result,) = await watcher.until(1, done)
    payload = result["payload"]
    assert payload["debateStatus"] == "completed"
    assert "debateSynthesis" not in payload
    assert payload["debateOutput"] == "optimist says 2\n\ncritic says 2"
    assert payload["debateTranscript"][-1]["turns"][0]["speaker"] == "optimist"  # extras stay


async def test_events_are_read_by_a_consumer_that_dedupes_by_request_id(
        url: str, redis: Redis, event_type: str) -> None:
    events, done = f"{event_type}:events", f"event:{event_type}:completed"
    app = worker(url, event_type, Runs(), publish_events=True, events_topic=events)
    marker = f"marker:{event_type}"
    async with running(app), watching(redis, events, done, marker) as watcher:
        await listening(redis, event_type, 1)
        await publish(redis, event_type, "ev-1", {"input": "Adopt Kafka?"})
        await watcher.until(1, done)
        # One subscriber gets its messages in publish order: with the marker, every event.
        await redis.publish(marker, json.dumps({"marker": 1}))
        await watcher.until(1, marker)
    seen = [m for c, m in watcher.synkro_view if c == events]
    assert len(seen) == len(watcher.on(events)) > 3  # Synkro's subscriber drops none of them
    assert [m["requestId"] for m in seen] == [f"ev-1:{i}" for i in range(1, len(seen) + 1)]
    assert [m["payload"]["seq"] for m in seen] == list(range(1, len(seen) + 1))
    assert seen[0]["payload"]["type"] == "debate_started"
    assert seen[-1]["payload"]["type"] == "debate_completed"
    assert all(m["payload"]["requestId"] == "ev-1" for m in seen)


@dataclass(frozen=True)
class Step:
    type: str
    on_failure: str | None = None


class Orchestrator:
    """Synkro's workflow orchestration for one workflow, as a script: publish the first step on
    ``workflow:<name>:<step>``; on ``event:…:completed`` go to the next step that is no branch
    target (the workflow completes when there is none); on ``…:failed`` go to ``onFailure``
    (or the workflow fails). The payload of each completion is the next step's payload."""

    def __init__(self, redis: Redis, name: str, steps: list[Step]) -> None:
        self.redis, self.name, self.steps = redis, name, steps
        self.branch_targets = {s.on_failure for s in steps if s.on_failure}
        self.paths: dict[str, list[str]] = {}
        self.outcomes: dict[str, tuple[str, Any]] = {}

    def channels(self) -> list[str]:
        return [f"event:{step_channel(self.name, s.type)}:{end}"
                for s in self.steps for end in ("completed", "failed")]

    async def start(self, request_id: str, payload: Any) -> None:
        await self._route(request_id, 0, payload)

    async def _route(self, request_id: str, index: int, payload: Any) -> None:
        self.paths.setdefault(request_id, []).append(self.steps[index].type)
        await publish(self.redis, step_channel(self.name, self.steps[index].type), request_id,
                      payload)

    async def advance(self, channel: str, message: Mapping[str, Any]) -> None:
        rid = message["requestId"]
        index = next(i for i, s in enumerate(self.steps)
                     if channel.startswith(f"event:{step_channel(self.name, s.type)}:"))
        if self.paths[rid][-1] != self.steps[index].type:
            return  # stale
        if channel.endswith(":failed"):
            target = self.steps[index].on_failure
            if target is None:
                self.outcomes[rid] = ("failed", message.get("payload"))
                return
            await self._route(rid, [s.type for s in self.steps].index(target), message["payload"])
            return
        following = [i for i in range(index + 1, len(self.steps))
                     if self.steps[i].type not in self.branch_targets]
        if not following:
            self.outcomes[rid] = ("completed", message["payload"])
            return
        await self._route(rid, following[0], message["payload"])


async def summarize(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    return {**payload, "summary": f"{len(payload['debateOutput'])} chars: {payload['debateOutput']}"}


async def notify(payload: Any) -> Mapping[str, Any]:
    return {"notified": True}


async def test_a_workflow_step_is_served_and_the_workflow_advances_on_both_branches(
        url: str, redis: Redis) -> None:
    name = f"debateFlow{uuid.uuid4().hex[:6]}"
    runs = Runs()
    app = worker(url, name, runs, step="debate:request")
    app.subscribe_synkro_step(name, "summarize", summarize)
    app.subscribe_synkro_step(name, "notify", notify)
    flow = Orchestrator(redis, name, [Step("debate:request", on_failure="notify"),
                                      Step("summarize"), Step("notify")])
    async with running(app), watching(redis, *flow.channels()) as watcher:
        for step in ("debate:request", "summarize", "notify"):
            await listening(redis, step_channel(name, step), 1)
        requests = {"ok": {"input": "Adopt Kafka?", "team": "core"}, "bad": {"input": 42},
                    "down": {"input": "FAIL please"}}
        for rid, payload in requests.items():
            await flow.start(rid, payload)
        handled = 0
        async with asyncio.timeout(TIMEOUT):
            while len(flow.outcomes) < len(requests):
                while handled < len(watcher.synkro_view):
                    await flow.advance(*watcher.synkro_view[handled])
                    handled += 1
                await asyncio.sleep(0.02)
    assert flow.paths == {"ok": ["debate:request", "summarize"],
                          "bad": ["debate:request", "notify"],
                          "down": ["debate:request", "summarize"]}  # a failed debate completes
    status, ok = flow.outcomes["ok"]
    assert status == "completed"
    assert ok["team"] == "core" and ok["debateStatus"] == "completed"
    assert ok["summary"] == f"{len(ok['debateOutput'])} chars: {ok['debateOutput']}"
    assert flow.outcomes["bad"] == ("completed", {"notified": True})
    assert flow.outcomes["down"][1]["summary"].endswith(flow.outcomes["down"][1]["debateOutput"])
    assert flow.outcomes["down"][1]["debateOutput"].startswith("LLM call failed: ")
    # Synkro keeps no metrics and no dead letters for workflow steps
    assert not await redis.keys(f"synkro:metrics:workflow:{name}:*")
    assert not await redis.exists(dlq_key(step_channel(name, "debate:request")))


async def test_ttls_are_configurable_and_a_handler_error_lets_the_lock_go(
        url: str, redis: Redis, event_type: str) -> None:
    gate, started, calls = asyncio.Event(), asyncio.Event(), list[str]()

    async def slow_then_flaky(payload: Mapping[str, Any]) -> Mapping[str, Any]:
        calls.append(str(payload["n"]))
        started.set()
        if payload["n"] == 1:
            await gate.wait()
        if payload["n"] == 2 and calls.count("2") == 1:
            raise RuntimeError("flaky once")
        return {**payload, "debateStatus": "completed"}

    settings = SynkroSettings(lock_ttl_s=7, dedupe_ttl_s=11, metrics_ttl_s=13)
    app = DebateBus(url, heartbeat_interval_s=None, transport_options={"synkro": settings})
    app.subscribe(event_type, slow_then_flaky)
    done = f"event:{event_type}:completed"
    async with running(app), watching(redis, done) as watcher:
        await listening(redis, event_type, 1)
        await publish(redis, event_type, "slow", {"n": 1})
        await asyncio.wait_for(started.wait(), TIMEOUT)
        assert 0 < await redis.ttl(lock_key("slow", event_type)) <= 7  # held while handling
        gate.set()
        await publish(redis, event_type, "flaky", {"n": 2})
        await watcher.until(2, done)
    assert calls.count("2") == 2  # requeued after the error, its lock let go, claimed again
    assert sorted(m["requestId"] for m in watcher.on(done)) == ["flaky", "slow"]
    assert 0 < await redis.ttl(dedupe_key("slow", event_type)) <= 11
    assert 0 < await redis.ttl(metrics_key(event_type, "completed")) <= 13
    assert not await redis.exists(lock_key("flaky", event_type))
