"""One debate per debate id, never the wrong answer, bounded store calls, durable by default."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from tests.support.servers import RedisServer

from debatebus import Debate, Judge, Participant
from debatebus.checkpoints import (
    CheckpointStore,
    MemoryCheckpointStore,
    RedisCheckpointStore,
    SQLiteCheckpointStore,
    store_for_broker,
)
from debatebus.checkpoints._base import Counters
from debatebus.exceptions import ConfigError, InputError, TransportError
from debatebus.handlers import attach_default_stores
from debatebus.handlers._checkpointing import debate_key, decode_result
from debatebus.handlers._inputs import request_fingerprint
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM

ROUNDS = 2
NEEDED = 1 + 3 * ROUNDS + 1  # framing, per round two turns and a judge, synthesis


class Crash(BaseException):
    """A worker dying mid-call: not an Exception, so no failure policy catches it."""


class Counting:
    """A FunctionLLM that takes a little time per call (so copies overlap) and counts calls."""

    def __init__(self, crash_at: int | None = None, delay_s: float = 0.01) -> None:
        self.calls: list[str] = []
        self.crash_at = crash_at
        self.delay_s = delay_s
        self.llm = FunctionLLM(self._answer, model="counting")

    async def _answer(self, request: LLMRequest) -> Any:
        await asyncio.sleep(self.delay_s)
        if self.crash_at is not None and len(self.calls) + 1 == self.crash_at:
            self.crash_at = None
            raise Crash("the worker died")
        self.calls.append(f"{request.purpose}:{request.round}:{request.speaker}")
        if request.purpose == "judge":
            return {"consensus": False, "summary": f"round {request.round}"}
        return f"{request.speaker} in round {request.round}"


def make_debate(counting: Counting) -> Debate:
    return Debate("once", [Participant("a", "For."), Participant("b", "Against.")],
                  llm=counting.llm, moderator=Participant("mod", "Moderate."), judge=Judge(),
                  max_rounds=ROUNDS)


@pytest.fixture(params=["none", "memory", "sqlite",
                        pytest.param("redis", marks=pytest.mark.redis)])
async def make_store(request: pytest.FixtureRequest,
                     tmp_path: Path) -> AsyncIterator[Callable[[], CheckpointStore | None]]:
    """Opens a store on shared data each call, as another worker would (memory: the same one)."""
    opened: list[CheckpointStore] = []
    shared = MemoryCheckpointStore()

    def make() -> CheckpointStore | None:
        kind = request.param
        if kind in ("none", "memory"):
            return None if kind == "none" else shared
        if kind == "sqlite":
            store: CheckpointStore = SQLiteCheckpointStore(tmp_path / "ckpt.db")
        else:
            url = request.getfixturevalue("redis_server").url
            store = RedisCheckpointStore(url, prefix=f"once-{tmp_path.name}")
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


async def test_five_concurrent_copies_cost_one_debate(
        make_store: Callable[[], CheckpointStore | None]) -> None:
    counting = Counting()
    handler = make_debate(counting).as_handler(store=make_store())
    results = await asyncio.gather(*(handler({"input": "t", "n": i}, request_id="r1")
                                     for i in range(5)))
    assert len(counting.calls) == NEEDED
    assert sorted(r["debateReplayed"] for r in results) == [False, True, True, True, True]
    assert {r["debateOutput"] for r in results} == {results[0]["debateOutput"]}
    assert [r["n"] for r in results] == list(range(5)), "each copy keeps its own payload"


async def test_copies_on_two_workers_with_the_same_owner_name_cost_one_debate(
        make_store: Callable[[], CheckpointStore | None]) -> None:
    first, second = make_store(), make_store()
    if first is None:
        pytest.skip("workers without a store share nothing")
    counting = Counting()
    debate = make_debate(counting)
    # The same owner name on both: leases are per run, so neither can take the other's lease.
    workers = [debate.as_handler(store=s, owner="worker") for s in (first, second)]
    results = await asyncio.gather(*(workers[i % 2]({"input": "t"}, request_id="r2")
                                     for i in range(6)))
    assert len(counting.calls) == NEEDED
    assert [r["debateReplayed"] for r in results].count(False) == 1


async def test_copies_take_over_when_the_run_they_wait_for_dies() -> None:
    counting = Counting(crash_at=5)  # the framing and round 1 are committed, then a crash
    handler = make_debate(counting).as_handler(store=MemoryCheckpointStore())
    results = await asyncio.gather(*(handler({"input": "t"}, request_id="r3") for _ in range(3)),
                                   return_exceptions=True)
    assert sum(isinstance(r, Crash) for r in results) == 1
    answers = [r for r in results if isinstance(r, dict)]
    assert len(answers) == 2
    assert sorted(r["debateReplayed"] for r in answers) == [False, True]
    assert answers[0]["debateStatus"] == "completed"
    assert len(counting.calls) == NEEDED  # the survivor resumed after round 1: nothing repeated


# ---- never the wrong answer --------------------------------------------------------------------


async def test_a_used_request_id_with_another_input_is_refused() -> None:
    counting = Counting()
    handler = make_debate(counting).as_handler(store=MemoryCheckpointStore())
    first = await handler({"input": "is tea better than coffee?"}, request_id="r4")
    with pytest.raises(InputError) as refused:
        await handler({"input": "is coffee better than tea?"}, request_id="r4")
    message = str(refused.value)
    assert "requestId 'r4' was already used for a debate with a different input" in message
    assert "new requestId" in message and '"replay": "rerun"' in message
    with pytest.raises(InputError, match="different input"):
        await handler({"input": "is tea better than coffee?", "maxRounds": 1}, request_id="r4")
    rerun = await handler({"input": "is coffee better than tea?", "replay": "rerun"},
                          request_id="r4")
    assert rerun["debateStatus"] == "completed" and rerun["debateId"] != first["debateId"]
    same = await handler({"input": "is tea better than coffee?"}, request_id="r4")
    assert same["debateReplayed"] is True and same["debateOutput"] == first["debateOutput"]
    assert len(counting.calls) == 2 * NEEDED


async def test_a_debate_id_naming_another_requests_debate_with_another_input_is_refused() -> None:
    handler = make_debate(Counting()).as_handler(store=MemoryCheckpointStore())
    await handler({"input": "first question"}, request_id="r5")
    with pytest.raises(InputError) as refused:
        await handler({"input": "second question", "debateId": "r5"}, request_id="r6")
    assert "debateId 'r5' was already used" in str(refused.value)
    assert "new requestId without debateId" in str(refused.value)
    same = await handler({"input": "first question", "debateId": "r5"}, request_id="r7")
    assert same["debateReplayed"] is True


async def test_another_input_cannot_resume_a_checkpointed_debate() -> None:
    store = MemoryCheckpointStore()
    with pytest.raises(Crash):
        await make_debate(Counting(crash_at=5)).as_handler(store=store)({"input": "a"},
                                                                         request_id="r8")
    counting = Counting()
    handler = make_debate(counting).as_handler(store=store)
    with pytest.raises(InputError, match="requestId 'r8' was already used"):
        await handler({"input": "b"}, request_id="r8")
    assert counting.calls == []
    assert await store.get_lease(debate_key("once", "r8")) is None, "the refused run must release the lease"
    resumed = await handler({"input": "a"}, request_id="r8")
    assert resumed["debateStatus"] == "completed"


async def test_concurrent_copies_with_different_inputs_never_share_an_answer() -> None:
    handler = make_debate(Counting()).as_handler(store=MemoryCheckpointStore())
    results = await asyncio.gather(handler({"input": "x"}, request_id="r9"),
                                   handler({"input": "y"}, request_id="r9"),
                                   return_exceptions=True)
    assert isinstance(results[0], dict) and results[0]["debateReplayed"] is False
    assert isinstance(results[1], InputError)


async def test_a_v02_debate_is_not_found_under_its_bare_id() -> None:
    """v0.2 kept debates under the bare debate id; this version keys them by event type (or, called
    directly, the debate's name), so an old record is never taken for this request's answer."""
    store = MemoryCheckpointStore()
    counting = Counting()
    handler = make_debate(counting).as_handler(store=store)
    await store.put_result("old", b'{"debateId": "old", "debateStatus": "completed"}')
    answered = await handler({"input": "anything"}, request_id="old")
    assert answered["debateReplayed"] is False and counting.calls


async def test_the_stored_result_records_the_fingerprint_but_returns_only_result_fields() -> None:
    store = MemoryCheckpointStore()
    handler = make_debate(Counting()).as_handler(store=store)
    first = await handler({"input": "q", "maxRounds": 1}, request_id="fp")
    raw = await store.get_result(debate_key("once", "fp"))
    assert raw is not None
    stored = decode_result(raw)
    assert stored.fingerprint == request_fingerprint("q", 1)
    assert set(stored.fields) <= set(first)
    again = await handler({"input": "q", "maxRounds": 1}, request_id="fp")
    assert set(again) == set(first)


# ---- bounded store calls -----------------------------------------------------------------------


class FailingStore(MemoryCheckpointStore):
    """A store whose named operations fail as a store behind a dead network does once its own
    timeout expires."""

    def __init__(self, *failing: str) -> None:
        super().__init__()
        self.failing = set(failing)

    def _fail(self, op: str) -> None:
        if op in self.failing:
            raise TransportError(f"{op}: did not answer within 0.1 s")

    async def start(self, debate_id: str, owner: str, ttl_s: float, header: bytes) -> Any:
        self._fail("start")
        return await super().start(debate_id, owner, ttl_s, header)

    async def append_many(self, debate_id: str, entries: list[bytes], counters: Any) -> int:
        self._fail("append")
        return await super().append_many(debate_id, entries, counters)

    async def renew_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        self._fail("renew")
        return await super().renew_lease(debate_id, owner, ttl_s)


@pytest.mark.parametrize("op", ["start", "append"])
async def test_a_store_down_longer_than_store_outage_s_fails_the_call(op: str) -> None:
    handler = make_debate(Counting()).as_handler(store=FailingStore(op), store_outage_s=0.5)
    with pytest.raises(TransportError, match=f"{op}: did not answer"):
        await asyncio.wait_for(handler({"input": "t"}, request_id="down"), 10)


@pytest.mark.redis
async def test_a_stopped_redis_store_fails_each_call_within_its_timeout() -> None:
    redis_server = RedisServer.start(appendonly=False)  # its own: this test freezes it
    store = RedisCheckpointStore(redis_server.url, timeout_s=0.3)
    async with store:
        await store.begin("stopped", b"h")
        redis_server.pause()
        try:
            for call in (lambda: store.start("stopped", "w/1", 5, b"h"),
                         lambda: store.append("stopped", b"e", Counters()),
                         lambda: store.renew_lease("stopped", "w/1", 5),
                         lambda: store.load("stopped"),
                         lambda: store.release_lease("stopped", "w/1")):
                started = asyncio.get_running_loop().time()
                with pytest.raises(TransportError, match=r"did not answer|no reply within"):
                    await asyncio.wait_for(call(), 5)
                assert asyncio.get_running_loop().time() - started < 2.0
        finally:
            redis_server.resume()
    redis_server.stop()


async def test_a_store_outage_shorter_than_store_outage_s_is_ridden_out() -> None:
    class Flaky(MemoryCheckpointStore):
        """Every commit fails its first two attempts, as a store restarting would."""

        def __init__(self) -> None:
            super().__init__()
            self.failures = 0

        async def append_many(self, debate_id: str, entries: list[bytes], counters: Any) -> int:
            self.failures += 1
            if self.failures % 3:
                raise TransportError("store restarting")
            return await super().append_many(debate_id, entries, counters)

    counting, store = Counting(), Flaky()
    handler = make_debate(counting).as_handler(store=store, store_outage_s=30)
    result = await asyncio.wait_for(handler({"input": "t"}, request_id="flaky"), 30)
    assert result["debateStatus"] == "completed"
    assert len(counting.calls) == NEEDED  # no call paid twice for a commit that was retried
    assert store.failures > 3


async def test_failing_renewals_are_logged_once_and_do_not_stop_the_debate(
        caplog: pytest.LogCaptureFixture) -> None:
    slow = Counting(delay_s=0.1)  # the debate outlasts several renewals
    handler = make_debate(slow).as_handler(store=FailingStore("renew"), lease_ttl_s=0.15)
    with caplog.at_level(logging.WARNING, logger="debatebus.durable"):
        result = await asyncio.wait_for(handler({"input": "t"}, request_id="renew"), 10)
    assert result["debateStatus"] == "completed"
    assert caplog.text.count("could not renew leases") == 1, caplog.text


# ---- durable by default ------------------------------------------------------------------------


def test_durable_false_with_a_store_is_a_config_error() -> None:
    debate = make_debate(Counting())
    with pytest.raises(ConfigError, match="durable=False with a store"):
        debate.as_handler(store=MemoryCheckpointStore(), durable=False)
    with pytest.raises(ConfigError, match="store_outage_s"):
        debate.as_handler(store_outage_s=0)


def test_which_handlers_want_a_default_store() -> None:
    debate = make_debate(Counting())
    default, off = debate.as_handler(), debate.as_handler(durable=False)
    given = debate.as_handler(store=MemoryCheckpointStore())
    assert (default.wants_default_store, off.wants_default_store, given.wants_default_store) == (
        True, False, False)
    store = MemoryCheckpointStore()
    default.use_default_store(store)
    assert default.store is store and not default.wants_default_store
    for handler in (default, off, given):
        with pytest.raises(ConfigError, match="use_default_store"):
            handler.use_default_store(store)


async def test_a_direct_call_without_a_store_keeps_nothing() -> None:
    counting = Counting()
    handler = make_debate(counting).as_handler()
    await handler({"input": "t"}, request_id="direct")
    again = await handler({"input": "t"}, request_id="direct")
    assert again["debateReplayed"] is False and len(counting.calls) == 2 * NEEDED


def test_attach_default_stores_shares_one_store_per_bus() -> None:
    debate = make_debate(Counting())
    a, b, off = debate.as_handler(), debate.as_handler(), debate.as_handler(durable=False)
    given = debate.as_handler(store=MemoryCheckpointStore())
    store = attach_default_stores([a, b, a, off, given, object()], "memory://")
    assert isinstance(store, MemoryCheckpointStore)
    assert a.store is store and b.store is store
    assert off.store is None and given.store is not store
    assert attach_default_stores([a, off], "memory://") is None  # nobody wants one any more


@pytest.mark.parametrize(("url", "why"), [("kafka://127.0.0.1:9092", "the broker is Kafka"),
                                          (None, "the bus was given a transport")])
def test_no_default_store_logs_one_warning_with_the_consequence_and_the_fix(
        url: str | None, why: str, caplog: pytest.LogCaptureFixture) -> None:
    debate = make_debate(Counting())
    handlers = [debate.as_handler(), debate.as_handler()]
    with caplog.at_level(logging.WARNING, logger="debatebus.durable"):
        assert attach_default_stores(handlers, url) is None
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert text.startswith(why)
    assert "re-runs its debate" in text and "pays for every LLM call again" in text
    assert "as_handler(store=RedisCheckpointStore(" in text and "SQLiteCheckpointStore(" in text
    assert all(h.wants_default_store for h in handlers)
    assert attach_default_stores([debate.as_handler(durable=False)], url) is None
    assert len(caplog.records) == 1, "no warning when no handler wants a store"


def test_store_for_broker_maps_each_scheme() -> None:
    assert isinstance(store_for_broker("memory://"), MemoryCheckpointStore)
    assert store_for_broker("kafka://127.0.0.1:9092,127.0.0.1:9093") is None
    for url in ("redis://h:1/2", "rediss://:pw@h:1/2", "redis+pubsub://h/0",
                "rediss+pubsub://h/0?protocol=3"):
        assert isinstance(store_for_broker(url), RedisCheckpointStore)
    with pytest.raises(ConfigError) as refused:
        store_for_broker("amqp://user:hunter22@h/")
    assert "hunter22" not in str(refused.value) and "'amqp'" in str(refused.value)


@pytest.mark.redis
@pytest.mark.parametrize("scheme", ["redis", "redis+pubsub"])
async def test_the_default_redis_store_is_on_the_brokers_server_and_db(
        redis_server: Any, scheme: str, tmp_path: Path) -> None:
    url = redis_server.url.replace("redis://", f"{scheme}://").removesuffix("/0") + "/3?protocol=3"
    store = store_for_broker(url)
    assert store is not None
    debate_id = f"on-db-3-{tmp_path.name}"
    async with store:
        await store.put_result(debate_id, b"r")
    import redis

    def keys_on(db: int) -> list[bytes]:
        with redis.Redis(host="127.0.0.1", port=redis_server.port, db=db,
                         password=redis_server.password) as client:
            return list(client.keys(f"*{debate_id}*"))

    assert keys_on(3) and not keys_on(0)
