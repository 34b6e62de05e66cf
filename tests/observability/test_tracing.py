"""Traces: the debate → round → call span tree, and trace context crossing the bus."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tests.observability.observed import DOOMED, TIMEOUT, app_on, new_event_type
from tests.support.bus import running, transport_options

from debatebus.client import BusClient
from debatebus.observability._observer import RequestContext
from debatebus.observability._tracing import TracingObserver, inject_traceparent
from debatebus.schemas import events as ev
from debatebus.schemas.envelope import Envelope

pytestmark = pytest.mark.redis


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def traceparent_of(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if parent_id(s) == parent.get_span_context().span_id]


async def publish_in_span(url: str, et: str, provider: TracerProvider,
                          payloads: list[dict[str, Any]]) -> tuple[ReadableSpan, list[Envelope]]:
    """The producer's span around its requests; returns it and the results."""
    app = app_on(url, et, [TracingObserver(tracer_provider=provider)])
    tracer = provider.get_tracer("tests.producer")
    async with running(app), BusClient(url, **transport_options(url)) as client:
        with tracer.start_as_current_span("producer", kind=SpanKind.PRODUCER) as producer:
            results = [await client.request(et, p, timeout=TIMEOUT) for p in payloads]
    assert isinstance(producer, ReadableSpan)
    return producer, results


async def test_debate_round_call_span_tree(redis_server: Any, traced: Any) -> None:
    provider, exporter = traced
    et = new_event_type()
    producer, (result,) = await publish_in_span(redis_server.url, et, provider,
                                                [{"input": "Should we adopt microservices?"}])
    assert result.payload["debateStatus"] == "completed"
    spans = list(exporter.get_finished_spans())
    (debate,) = [s for s in spans if s.name == "debate bus-debate"]
    assert debate.kind is SpanKind.CONSUMER
    assert debate.attributes is not None
    assert debate.attributes["debatebus.request_id"] == result.request_id
    assert debate.attributes["debatebus.outcome"] == "completed"
    assert debate.attributes["messaging.destination.name"] == et

    under_debate = children(spans, debate)
    rounds = sorted((s for s in under_debate if s.name.startswith("round ")), key=lambda s: s.name)
    assert [r.name for r in rounds] == ["round 1", "round 2"]
    assert sorted(s.name for s in under_debate if s not in rounds) == [
        "framing moderator", "synthesis moderator"]
    for number, rnd in enumerate(rounds, start=1):
        calls = children(spans, rnd)
        assert sorted(c.name for c in calls) == ["judge judge", "turn critic", "turn optimist"]
        for call in calls:
            attrs = call.attributes or {}
            assert call.kind is SpanKind.CLIENT
            assert attrs["debatebus.round"] == number
            assert attrs["gen_ai.usage.input_tokens"] > 0
            assert attrs["gen_ai.usage.output_tokens"] > 0
            assert call.start_time is not None
            assert call.end_time is not None
            assert call.start_time <= call.end_time
        turn = next(c for c in calls if c.name == "turn optimist")
        assert (turn.attributes or {})["debatebus.participant"] == "optimist"
    assert {s.context.trace_id for s in spans} == {producer.context.trace_id}


async def test_trace_context_crosses_the_bus(redis_server: Any, traced: Any) -> None:
    provider, exporter = traced
    et = new_event_type()
    producer, (result,) = await publish_in_span(redis_server.url, et, provider,
                                                [{"input": "Should we adopt microservices?"}])
    (debate,) = [s for s in exporter.get_finished_spans() if s.name.startswith("debate ")]
    # publisher → debate: the request's traceparent is the producer span's.
    assert debate.context.trace_id == producer.context.trace_id
    assert parent_id(debate) == producer.context.span_id
    # debate → the next consumer: the result carries the debate span's traceparent.
    assert result.headers["traceparent"] == traceparent_of(debate)


async def test_a_chain_of_consumers_is_one_trace(redis_server: Any, traced: Any) -> None:
    provider, exporter = traced
    et = new_event_type()
    producer, (first,) = await publish_in_span(redis_server.url, et, provider,
                                               [{"input": "Should we adopt microservices?"}])
    # A second consumer acts on the first result, passing its headers on (outside any span).
    url = redis_server.url
    async with running(app_on(url, et, [TracingObserver(tracer_provider=provider)])), \
            BusClient(url, **transport_options(url)) as client:
        second = await client.request(et, {"input": "And then?"}, headers=first.headers,
                                      timeout=TIMEOUT)
    debates = {s.attributes["debatebus.request_id"]: s  # type: ignore[index]
               for s in exporter.get_finished_spans() if s.name.startswith("debate ")}
    one, two = debates[first.request_id], debates[second.request_id]
    assert parent_id(two) == one.context.span_id
    assert one.context.trace_id == two.context.trace_id == producer.context.trace_id
    assert second.headers["traceparent"] == traceparent_of(two)


async def test_failed_debate_and_bad_input_spans_are_errors(redis_server: Any, traced: Any) -> None:
    provider, exporter = traced
    et = new_event_type()
    _, (failed, bad) = await publish_in_span(redis_server.url, et, provider,
                                             [{"input": f"{DOOMED} topic"}, {"no": "input"}])
    debates = {s.attributes["debatebus.request_id"]: s  # type: ignore[index]
               for s in exporter.get_finished_spans() if s.name.startswith("debate ")}
    for result, outcome in ((failed, "failed"), (bad, "bad_input")):
        span = debates[result.request_id]
        assert span.status.status_code is StatusCode.ERROR
        assert (span.attributes or {})["debatebus.outcome"] == outcome
        assert "traceparent" in result.headers
    failed_turns = [s for s in exporter.get_finished_spans()
                    if s.name.startswith("turn ") and s.status.status_code is StatusCode.ERROR]
    assert len(failed_turns) == 2
    assert all("sk-ant-api03" not in (s.status.description or "") for s in failed_turns)
    assert all("[REDACTED]" in (s.status.description or "") for s in failed_turns)


def test_inject_traceparent_keeps_what_the_caller_set(traced: Any) -> None:
    provider, _ = traced
    assert inject_traceparent({"a": "b"}) == {"a": "b"}  # no span active
    with provider.get_tracer("t").start_as_current_span("s") as span:
        injected = inject_traceparent({"a": "b"})
        assert injected["traceparent"] == traceparent_of(span)
        assert injected["a"] == "b"
        assert inject_traceparent({"traceparent": "mine"}) == {"traceparent": "mine"}


def test_a_no_op_without_opentelemetry() -> None:
    script = textwrap.dedent("""
        import sys
        sys.modules["opentelemetry"] = None  # as if it were not installed
        from debatebus.client import BusClient
        from debatebus.observability._tracing import OTEL_AVAILABLE, TracingObserver, inject_traceparent
        from debatebus.observability._observer import RequestContext
        observer = TracingObserver()
        ctx = RequestContext("debate:request", "1-0", 1, headers={"traceparent": "x"})
        observer.request_started(ctx)
        assert observer.outgoing_headers(ctx) == {}
        observer.request_finished(ctx, "completed", None, 0.1)
        assert not OTEL_AVAILABLE and not observer.enabled
        assert inject_traceparent({"a": "b"}) == {"a": "b"}
        print("no-op")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no-op"


def test_a_debate_cut_short_ends_its_open_round(traced: Any) -> None:
    provider, exporter = traced
    observer = TracingObserver(tracer_provider=provider)
    ctx = RequestContext("debate:request", "1-0", 2, request_id="r-1", debate_name="d")
    observer.request_started(ctx)
    observer.debate_event(ctx, ev.RoundStarted(debate_id="r-1", seq=1, round=1, phase="opening"))
    observer.request_finished(ctx, "unsettled", None, 0.1)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"debate d", "round 1"}
    assert spans["round 1"].status.status_code is StatusCode.ERROR
    assert spans["debate d"].status.status_code is StatusCode.ERROR
    assert (spans["debate d"].attributes or {})["debatebus.deliveries"] == 2
    assert spans["debate d"].parent is None  # no traceparent: a root span
