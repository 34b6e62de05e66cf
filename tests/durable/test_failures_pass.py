"""Failures are not final: a failure that may pass (a provider's error, a wrong key, a timeout) is
published but never stored as the debate's answer, so a resend after the fix runs it again from
its last committed round; only final failures (a budget reached) are answered from the store."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from tests.support.bus import running, transport_options

from debatebus import Budget, Debate, Judge, Participant
from debatebus._worker import DebateBus
from debatebus.checkpoints import MemoryCheckpointStore, store_from_url
from debatebus.cli._ops_cmds import replay_range
from debatebus.client import BusClient
from debatebus.exceptions import LLMError, TransportError
from debatebus.handlers._checkpointing import debate_key
from debatebus.llm import LLMRequest
from debatebus.observability._logs import LoggingObserver
from debatebus.observability._metrics import PrometheusObserver
from debatebus.schemas.envelope import Envelope
from debatebus.testing import DebateTestBus, FunctionLLM
from debatebus.transports import transport_from_url

NAME = "passing"


class Provider:
    """A model whose key can be revoked from a given round on; it records every call."""

    def __init__(self, *, broken_from_round: int | None = None,
                 error: type[Exception] = LLMError) -> None:
        self.broken_from_round = broken_from_round
        self.error = error
        self.calls: list[tuple[str, int]] = []

    def fix(self) -> None:
        self.broken_from_round = None

    def __call__(self, request: LLMRequest) -> Any:
        self.calls.append((request.purpose, request.round))
        if self.broken_from_round is not None and request.round >= self.broken_from_round:
            raise self.error("HTTP 401 from the provider: invalid API key")
        if request.purpose == "judge":
            return {"consensus": False, "summary": f"round {request.round} still split"}
        return f"{request.speaker} on round {request.round}"


def debate(provider: Provider, **options: Any) -> Debate:
    return Debate(NAME, [Participant("a", "For."), Participant("b", "Against.")],
                  llm=FunctionLLM(provider), moderator=Participant("mod", "Moderate."),
                  judge=Judge(), max_rounds=3, **options)


# one framing + per round (2 turns + 1 judge) + one synthesis
FULL_DEBATE_CALLS = 1 + 3 * 3 + 1


async def test_a_failure_that_may_pass_is_published_not_stored_and_a_resend_resumes_it() -> None:
    store = MemoryCheckpointStore()
    provider = Provider(broken_from_round=2)  # the key is revoked after round 1 was committed
    handler = debate(provider).as_handler(store=store)

    failed = await handler({"input": "Adopt microservices?"}, request_id="r1")
    assert failed["debateStatus"] == "failed"
    assert failed["debateRetryable"] is True
    assert "invalid API key" in failed["debateError"]
    key = debate_key(NAME, "r1")
    assert await store.get_result(key) is None, "a failure that may pass was stored as final"
    checkpoint = await store.load(key)
    assert checkpoint is not None and len(checkpoint.entries) == 2  # the framing and round 1
    paid_before = len(provider.calls)

    provider.fix()
    answered = await handler({"input": "Adopt microservices?"}, request_id="r1")
    assert answered["debateStatus"] == "completed"
    assert answered["debateReplayed"] is False
    assert answered["debateResumedFromRound"] == 1
    assert "debateRetryable" not in answered
    assert [r["number"] for r in answered["debateTranscript"]] == [1, 2, 3]
    rerun_calls = provider.calls[paid_before:]
    assert all(purpose != "framing" and number >= 2 for purpose, number in rerun_calls), \
        "a committed step was paid again"
    # Everything committed was paid once; only round 2's failed calls were paid twice.
    assert len(rerun_calls) == FULL_DEBATE_CALLS - 1 - 3
    assert await store.get_result(key) is not None  # the answer is final now

    again = await handler({"input": "Adopt microservices?"}, request_id="r1")
    assert again["debateReplayed"] is True and again["debateStatus"] == "completed"
    assert len(provider.calls) == paid_before + len(rerun_calls)


async def test_a_bad_key_from_the_start_fails_every_time_until_fixed_then_answers() -> None:
    store = MemoryCheckpointStore()
    provider = Provider(broken_from_round=0)  # the framing (round 0) already fails
    handler = debate(provider).as_handler(store=store)
    for _ in range(2):
        failed = await handler({"input": "q"}, request_id="r2")
        assert failed["debateStatus"] == "failed" and failed["debateRetryable"] is True
        assert failed["debateReplayed"] is False  # each resend ran again: nothing was stored
    assert len(provider.calls) == 2  # one framing call each
    provider.fix()
    answered = await handler({"input": "q"}, request_id="r2")
    assert answered["debateStatus"] == "completed" and answered["debateReplayed"] is False
    assert len(provider.calls) == 2 + FULL_DEBATE_CALLS


async def test_a_final_failure_is_stored_and_answered_from_the_store() -> None:
    store = MemoryCheckpointStore()
    provider = Provider()
    handler = debate(provider, budget=Budget(max_calls=4)).as_handler(store=store)
    failed = await handler({"input": "q"}, request_id="r3")
    assert failed["debateStatus"] == "failed" and failed["debateRetryable"] is False
    assert "budget max_calls=4 reached" in failed["debateError"]
    paid = len(provider.calls)
    again = await handler({"input": "q"}, request_id="r3")
    assert again["debateReplayed"] is True and again["debateStatus"] == "failed"
    assert again["debateError"] == failed["debateError"]
    assert len(provider.calls) == paid, "a stored final failure was run again"


async def test_a_missed_deadline_may_pass() -> None:
    async def slow(request: LLMRequest) -> str:
        await asyncio.sleep(0.2)
        return "late"

    store = MemoryCheckpointStore()
    slow_debate = Debate(NAME, [Participant("a", "For."), Participant("b", "Against.")],
                         llm=FunctionLLM(slow), deadline_s=0.05)
    failed = await slow_debate.as_handler(store=store)({"input": "q"}, request_id="r4")
    assert failed["debateStatus"] == "failed" and failed["debateRetryable"] is True
    assert "deadline" in failed["debateError"]
    assert await store.get_result(debate_key(NAME, "r4")) is None


async def test_a_broker_or_store_error_inside_the_debate_is_raised_not_published() -> None:
    """A rate limiter on Redis (or any infrastructure) failing mid-debate ends the handler with
    TransportError, which the worker answers by releasing the delivery; nothing is stored."""
    store = MemoryCheckpointStore()
    provider = Provider(broken_from_round=2, error=TransportError)
    handler = debate(provider).as_handler(store=store)
    with pytest.raises(TransportError):
        await handler({"input": "q"}, request_id="r5")
    key = debate_key(NAME, "r5")
    assert await store.get_result(key) is None
    assert await store.get_lease(key) is None, "the failed run kept its lease"
    checkpoint = await store.load(key)
    assert checkpoint is not None and len(checkpoint.entries) == 2  # kept for the redelivery
    provider.fix()
    answered = await handler({"input": "q"}, request_id="r5")
    assert answered["debateStatus"] == "completed" and answered["debateResumedFromRound"] == 1


async def test_a_participants_failure_under_degrade_never_raises_a_transport_error() -> None:
    """Under the default failure policy a participant's provider error is a failed turn; the same
    policy must not swallow an infrastructure error as if it were the participant's."""
    provider = Provider(broken_from_round=1, error=TransportError)
    with pytest.raises(TransportError):
        await debate(provider).run("q")


async def test_logs_metrics_and_results_tell_the_same_story(caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    """A stored final failure answered again is a replay everywhere (no 'request failed' line,
    counted as replayed, ``debateReplayed``); a failure that may pass says so in its log line."""
    registry = CollectorRegistry()
    caplog.set_level(logging.INFO, logger="debatebus.requests")
    budgeted = debate(Provider(), budget=Budget(max_calls=4))
    async with DebateTestBus(budgeted.as_handler(store=MemoryCheckpointStore()),
                             observers=[LoggingObserver(), PrometheusObserver(registry)]) as bus:
        first = await bus.request({"input": "q"}, request_id="b1")
        again = await bus.request({"input": "q"}, request_id="b1")
    keyless = Debate("keyless", [Participant("a", "For."), Participant("b", "Against.")],
                     llm=FunctionLLM(Provider(broken_from_round=0)))
    async with DebateTestBus(keyless.as_handler(store=MemoryCheckpointStore()),
                             observers=[LoggingObserver()]) as bus:
        may_pass = await bus.request({"input": "q"}, request_id="k1")
    assert first.payload["debateReplayed"] is False and again.payload["debateReplayed"] is True
    finished = [r for r in caplog.records if getattr(r, "outcome", None)]
    outcomes = [(getattr(r, "requestId", None), getattr(r, "outcome", None)) for r in finished]
    assert outcomes == [("b1", "failed"), ("b1", "replayed"), ("k1", "failed")]
    assert "answered from the store" in finished[1].getMessage()
    assert finished[1].levelno == logging.INFO
    assert may_pass.payload["debateRetryable"] is True
    assert "may pass" in finished[2].getMessage()

    def counted(name: str, event_type: str) -> float | None:
        return registry.get_sample_value(f"debatebus_{name}_total", {"event_type": event_type})

    assert counted("debates_failed", "debate:request") == 1
    assert counted("debates_replayed", "debate:request") == 1


@pytest.mark.redis
async def test_after_the_key_is_fixed_a_resend_and_replay_failed_answer_on_redis(
        redis_server: Any) -> None:
    """On a real worker: requests fail with a revoked key after round 1; once it is fixed, one is
    resent and the others come back by ``replay --failed``; each pays only what it had not
    committed, and a finished request is not re-published. A request that was bad input fails
    again on the replay, without running."""
    url, event_type = redis_server.url, f"debate:key{uuid.uuid4().hex[:6]}"
    provider = Provider(broken_from_round=2)
    app = DebateBus(url, transport_options=transport_options(url),
                    group=f"g-{uuid.uuid4().hex[:6]}", heartbeat_interval_s=None)
    app.subscribe(event_type, debate(provider).as_handler())
    rids = [f"key-{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]
    async with running(app), BusClient(url, **transport_options(url)) as client:
        failed = await asyncio.gather(*(client.request(event_type, {"input": f"q{n}"},
                                                       request_id=rid, timeout=60)
                                        for n, rid in enumerate(rids)))
        assert all(f.payload["debateRetryable"] is True for f in failed)
        bad = await client.request(event_type, {"input": ""}, request_id="bad-input", timeout=60)
        assert bad.payload["debateRetryable"] is False  # final: a replay answers it the same way
        paid_before = len(provider.calls)
        provider.fix()
        resent = await client.request(event_type, {"input": "q0"}, request_id=rids[0], timeout=60)
        assert resent.payload["debateStatus"] == "completed"
        assert resent.payload["debateResumedFromRound"] == 1
        results = await client.results(event_type)
        store = store_from_url(url)
        async with store, transport_from_url(url) as transport:
            summary = await replay_range(transport, event_type, store=store, only_failed=True)
        replayed: dict[str, Envelope] = {}
        async with asyncio.timeout(60):
            async for result in results:
                if result.request_id in (*rids[1:], "bad-input"):
                    replayed[result.request_id] = result
                if len(replayed) == 3:
                    break
    assert summary.republished == 3  # the resent one is finished: not re-published
    again = replayed.pop("bad-input")
    assert again.payload["debateStatus"] == "failed" and "payload.input is empty" in \
        again.payload["debateError"]
    assert all(r.payload["debateStatus"] == "completed" for r in replayed.values())
    assert all(r.payload["debateResumedFromRound"] == 1 for r in replayed.values())
    rerun_calls = provider.calls[paid_before:]
    assert all(purpose != "framing" and number >= 2 for purpose, number in rerun_calls)
    assert len(rerun_calls) == 3 * (FULL_DEBATE_CALLS - 1 - 3)
