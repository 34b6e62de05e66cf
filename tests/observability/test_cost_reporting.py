"""Cached tokens and costs where a debate is watched: on the wire (additive fields that old
readers and old messages survive), in Prometheus, on the live page, and in a bus child's result
as its parent reads it."""

from __future__ import annotations

import msgspec
from prometheus_client import CollectorRegistry

from debatebus._usage import TokenUsage
from debatebus.handlers._children import outcome_of
from debatebus.handlers._contract import HandlerResult
from debatebus.observability._metrics import PrometheusObserver
from debatebus.observability._observer import RequestContext
from debatebus.schemas import events as ev
from debatebus.schemas.cost import DebateCost
from debatebus.web._store import DebateStore

USAGE = TokenUsage.of(1000, 100, cache_read_tokens=600, cache_write_tokens=200)
COST = DebateCost("USD", 0.0123, {"ann": 0.01, "judge": 0.0023}, 0.0, "2030-01-01")


def test_usage_on_the_wire_is_additive() -> None:
    encoded = msgspec.json.encode(USAGE)
    assert msgspec.json.decode(encoded) == {
        "promptTokens": 1000, "completionTokens": 100, "totalTokens": 1100,
        "cacheReadTokens": 600, "cacheWriteTokens": 200}
    # A message from before the fields: they read as 0; the totals keep their meaning.
    old = msgspec.json.decode(b'{"promptTokens": 5, "completionTokens": 2, "totalTokens": 7}',
                              type=TokenUsage)
    assert old == TokenUsage.of(5, 2)
    assert USAGE + old - old == USAGE


def test_events_carry_cached_tokens_cost_and_stop_reason() -> None:
    ids = {"debate_id": "d-1", "request_id": "r-1"}
    failed = ev.DebateFailed(**ids, seq=9, rounds=1, error="budget max_cost=0.01 reached",
                             token_usage=USAGE, retryable=False, stop_reason="max_cost", cost=COST)
    body = msgspec.json.decode(msgspec.json.encode(failed))
    assert body["stopReason"] == "max_cost"
    assert body["cost"] == {"currency": "USD", "total": 0.0123, "children": 0.0,
                            "participants": {"ann": 0.01, "judge": 0.0023},
                            "pricesAsOf": "2030-01-01"}
    assert ev.EVENT_DECODER.decode(msgspec.json.encode(failed)) == failed
    # An event from an older worker decodes, without them.
    older = ev.EVENT_DECODER.decode(
        b'{"type": "debate_completed", "debateId": "d", "seq": 3, "rounds": 2, '
        b'"satisfied": true, "output": "x"}')
    assert isinstance(older, ev.DebateCompleted) and older.cost is None


def _total(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return sum(sample.value for metric in registry.collect() for sample in metric.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def test_prometheus_counts_cached_tokens_and_cost() -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry=registry)
    ctx = RequestContext("debate:request", "1-0", 1, request_id="r-1")
    observer.request_started(ctx)
    for seq in (1, 2):
        observer.debate_event(ctx, ev.TurnCompleted(debate_id="d", seq=seq, speaker="ann",
                                                    round=1, text="x", usage=USAGE, model="m"))
    observer.request_finished(ctx, "completed", HandlerResult("completed", {
        "debateCost": msgspec.to_builtins(COST)}), 1.0)
    tokens = "debatebus_llm_tokens_total"
    assert _total(registry, tokens, participant="ann", kind="prompt") == 2000
    assert _total(registry, tokens, participant="ann", kind="cache_read") == 1200
    assert _total(registry, tokens, participant="ann", kind="cache_write") == 400
    assert _total(registry, "debatebus_debate_cost_total", event_type="debate:request",
                  currency="USD") == 0.0123


def test_the_live_page_keeps_cached_tokens_and_the_cost() -> None:
    store = DebateStore()
    ids = {"debate_id": "d-1", "request_id": "r-1"}
    for event in (
        ev.DebateStarted(**ids, seq=1, question="Tabs?", debate_name="d", protocol="round-robin",
                         participants=["ann"], max_rounds=1),
        ev.TurnCompleted(**ids, seq=2, speaker="ann", round=1, text="Tabs.", usage=USAGE),
        ev.DebateCompleted(**ids, seq=3, rounds=1, satisfied=False, output="Tabs.",
                           token_usage=USAGE, cost=COST),
    ):
        store.ingest(msgspec.json.encode(event))
    [debate] = store.recent()
    assert debate["tokens"]["cacheReadTokens"] == 600
    assert debate["tokens"]["cacheWriteTokens"] == 200
    assert debate["cost"]["total"] == 0.0123


def test_a_bus_childs_result_gives_its_parent_its_usage_and_cost() -> None:
    fields = {"debateStatus": "completed", "debateSynthesis": "Do it.",
              "debateTokenUsage": msgspec.to_builtins(USAGE),
              "debateCost": msgspec.to_builtins(COST)}
    outcome = outcome_of(fields)
    assert (outcome.usage, outcome.cost) == (USAGE, COST)
    # A child answered without a cost (no prices, or an older worker): its cost is unknown.
    del fields["debateCost"]
    assert outcome_of(fields).cost is None
    assert outcome_of({**fields, "debateCost": {"total": "lots"}}).cost is None
