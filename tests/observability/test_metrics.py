"""Every Prometheus metric moves for real debates served on real Redis Streams."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from tests.observability.observed import (
    DOOMED,
    TIMEOUT,
    EventLog,
    FlakyStore,
    app_on,
    first,
    new_event_type,
)
from tests.support.bus import running, transport_options

from debatebus.client import BusClient
from debatebus.observability._metrics import PrometheusObserver
from debatebus.observability._observer import RequestContext
from debatebus.schemas import events as ev
from debatebus.transports import Outgoing, dlq_topic

pytestmark = pytest.mark.redis

TOPIC = "Should we adopt microservices?"


def total(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(sample.value for metric in registry.collect() for sample in metric.samples
               if sample.name == name and labels.items() <= sample.labels.items())


async def serve_every_outcome(url: str, et: str, observers: list[Any]) -> dict[str, Any]:
    """Publish one request of each kind and wait for each to be settled; returns the results."""
    app = app_on(url, et, observers, store=FlakyStore("resume-1"))
    async with running(app), BusClient(url, **transport_options(url)) as client:
        results = {
            "completed": await client.request(et, {"input": TOPIC}, request_id="ok-1",
                                              timeout=TIMEOUT),
            "replayed": await client.request(et, {"input": TOPIC}, request_id="ok-1",
                                             timeout=TIMEOUT),
            "failed": await client.request(et, {"input": f"{DOOMED} topic"}, timeout=TIMEOUT),
            "bad_input": await client.request(et, {"no": "input"}, timeout=TIMEOUT),
            "resumed": await client.request(et, {"input": TOPIC, "debateId": "resume-1"},
                                            timeout=TIMEOUT),
        }
        dead_letters = await client.transport.subscribe([dlq_topic(et)])
        await client.transport.publish(Outgoing(et, b"this is not JSON"))
        await first(dead_letters)
    # Leaving ``running`` drains the worker: every request_finished has run by now.
    return {kind: envelope.payload for kind, envelope in results.items()}


async def test_every_metric_moves_for_real_debates(redis_server: Any) -> None:
    et = new_event_type()
    registry = CollectorRegistry()
    in_flight_seen: list[float] = []

    def probe(ctx: RequestContext, event: ev.DebateEvent) -> None:
        if isinstance(event, ev.DebateStarted):
            in_flight_seen.append(total(registry, "debatebus_debates_in_flight", event_type=et))

    events = EventLog(probe)
    results = await serve_every_outcome(redis_server.url, et,
                                        [PrometheusObserver(registry=registry), events])
    assert results["completed"]["debateStatus"] == "completed"
    assert results["replayed"]["debateReplayed"] is True
    assert results["failed"]["debateStatus"] == "failed"
    assert results["bad_input"]["debateStatus"] == "failed"
    assert results["resumed"]["debateStatus"] == "completed"

    def value(name: str, **labels: str) -> float:
        return total(registry, f"debatebus_{name}", event_type=et, **labels)

    # ok-1, the doomed one, and resume-1 twice (interrupted, then resumed).
    assert value("debates_started_total") == 4
    assert value("debates_completed_total") == 2
    assert value("debates_failed_total") == 1
    assert value("debates_replayed_total") == 1
    assert value("debates_resumed_total") == 1
    assert value("bad_inputs_total") == 1
    assert value("dlq_entries_total") == 1
    assert value("unsettled_total") == 1  # resume-1's first delivery
    assert value("redeliveries_total") == 1  # resume-1's second delivery
    # ok-1: 2 rounds; doomed: none; resume-1: rounds 1 and 2 (round 2's write fails, which the
    # run hears at its end: group commit), then round 2 again after resuming.
    assert value("rounds_total") == len(events.of(ev.RoundCompleted)) == 5
    assert value("debate_duration_seconds_count", outcome="completed") == 2
    assert value("debate_duration_seconds_count", outcome="failed") == 1
    assert in_flight_seen
    assert min(in_flight_seen) >= 1
    assert value("debates_in_flight") == 0


async def test_llm_calls_and_tokens_by_participant_and_model(redis_server: Any) -> None:
    et = new_event_type()
    registry = CollectorRegistry()
    events = EventLog()
    await serve_every_outcome(redis_server.url, et, [PrometheusObserver(registry=registry), events])

    def calls(**labels: str) -> float:
        return total(registry, "debatebus_llm_calls_total", **labels)

    # optimist: ok-1 2 turns, resume-1 2 + 1 turns; 1 failed turn on the doomed topic.
    assert calls(participant="optimist", purpose="turn", outcome="ok") == 5
    assert calls(participant="optimist", purpose="turn", outcome="error") == 1
    # judge: ok-1 2 verdicts, resume-1 round 1, round 2 (lost), round 2 again.
    assert calls(participant="judge", purpose="judge") == 5
    # framing: once per debate (resume-1 keeps its committed framing); synthesis: per completion.
    assert calls(participant="moderator", purpose="framing") == 3
    # ... and resume-1's first run, which hears that its round 2 was not written only once it
    # has ended (group commit).
    assert calls(participant="moderator", purpose="synthesis") == 3
    models = {e.model or "unknown" for e in events.of(ev.TurnCompleted)}
    assert {s.labels["model"] for m in registry.collect() for s in m.samples
            if s.name == "debatebus_llm_calls_total"} == models
    for participant in ("optimist", "critic", "judge", "moderator"):
        spent = [e.usage for e in events.events
                 if isinstance(e, ev.FramingCompleted | ev.TurnCompleted | ev.TurnFailed
                               | ev.VerdictReached | ev.SynthesisCompleted)
                 and e.speaker == participant]
        prompt = total(registry, "debatebus_llm_tokens_total", participant=participant,
                       kind="prompt")
        completion = total(registry, "debatebus_llm_tokens_total", participant=participant,
                           kind="completion")
        assert prompt == sum(u.prompt_tokens for u in spent) > 0
        assert completion == sum(u.completion_tokens for u in spent) > 0
    # 6 turns each for optimist and critic, 5 verdicts, 3 framings, 3 syntheses.
    call_events = [e for e in events.events if isinstance(
        e, ev.FramingCompleted | ev.TurnCompleted | ev.TurnFailed | ev.VerdictReached
        | ev.SynthesisCompleted)]
    assert total(registry, "debatebus_llm_call_duration_seconds_count") == len(call_events) == 23


def test_metric_names_follow_prometheus_conventions() -> None:
    registry = CollectorRegistry()
    PrometheusObserver(registry=registry, namespace="debatebus")
    names = {metric.name: metric.type for metric in registry.collect()}
    for name, kind in names.items():
        assert name.startswith("debatebus_")
        if kind == "histogram":
            assert name.endswith("_seconds")
    exposed = {sample.name for metric in registry.collect() for sample in metric.samples}
    assert all(n.endswith("_total") for n in exposed if names.get(n.removesuffix("_total"))
               == "counter")
    assert {"debatebus_debates_in_flight", "debatebus_debate_duration_seconds",
            "debatebus_llm_calls", "debatebus_llm_tokens"} <= set(names)


def test_missing_prometheus_client_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "debatebus.observability._metrics", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'debatebus\[metrics\]'"):
        importlib.import_module("debatebus.observability._metrics")
