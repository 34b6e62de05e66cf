"""OpenTelemetry traces of debates: a span per debate, per round and per LLM call.

``app.add_observer(TracingObserver())`` (or ``debatebus worker … --otel``) uses the global tracer
provider, so whatever SDK and exporter the process configured (``opentelemetry-instrument``, or
your own ``TracerProvider``) receives the spans. Only ``opentelemetry-api`` is needed; without it
``TracingObserver`` does nothing and ``inject_traceparent`` returns the headers unchanged.

Trace context crosses the bus in the envelope's ``headers`` as W3C ``traceparent``/``tracestate``,
and is read from there only (never from a transport's own headers, such as a Streams entry's
``headers`` field): the debate span continues the trace of the request's ``traceparent``, and the
result envelope carries the debate span's, so a chain of consumers shows up as one trace.

The tree: ``debate {name}`` (consumer) → ``round {n}`` → ``{purpose} {participant}`` (client) for
each call; framing and synthesis calls happen outside rounds and hang off the debate span. Call
spans are made after the fact from the engine's call events (start = end − ``duration_ms``).
"""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Mapping
from typing import Any

from debatebus._redaction import redact
from debatebus._usage import TokenUsage
from debatebus.observability._events import CALL_PURPOSES, CallEvent, call_round
from debatebus.observability._observer import Observer, RequestContext, Settlement
from debatebus.schemas import events as ev
from debatebus.schemas.result import HandlerResult

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - covered by a subprocess test without opentelemetry
    OTEL_AVAILABLE = False
else:
    OTEL_AVAILABLE = True
    _PROPAGATOR = TraceContextTextMapPropagator()

# Per-request state kept in RequestContext.scratch (shared with other observers: hence prefixed).
_STARTED = "otel.started_ns"
_DEBATE = "otel.debate_span"
_ROUNDS = "otel.round_spans"
_FAILED_OUTCOMES = ("failed", "bad_input", "dead_lettered", "unsettled")


def inject_traceparent(headers: Mapping[str, str] | None = None) -> dict[str, str]:
    """``headers`` plus the current span's ``traceparent`` (and ``tracestate``), for producers
    putting a request on the bus. Unchanged when OpenTelemetry is absent, no span is active, or
    the headers already carry a ``traceparent`` (the caller's choice wins)."""
    out = dict(headers or {})
    if OTEL_AVAILABLE and "traceparent" not in out \
            and trace.get_current_span().get_span_context().is_valid:
        _PROPAGATOR.inject(out)
    return out


def provider_configured() -> bool:
    """Whether this process set a global tracer provider (an SDK): until one is set, spans made
    through the global provider are dropped."""
    return OTEL_AVAILABLE and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _tracer(provider: trace.TracerProvider | None) -> trace.Tracer:
    try:
        version: str | None = importlib.metadata.version("debatebus")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a checkout
        version = None
    return trace.get_tracer("debatebus", version, tracer_provider=provider)


class TracingObserver(Observer):
    """Spans for every request a worker handles; ``tracer_provider`` None means the global one."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = _tracer(tracer_provider) if OTEL_AVAILABLE else None

    @property
    def enabled(self) -> bool:
        """False when OpenTelemetry is not installed: every hook is then a no-op."""
        return self._tracer is not None

    # ---- hooks --------------------------------------------------------------------------------

    def request_started(self, ctx: RequestContext) -> None:
        # The span itself waits: the request id and the traceparent are only known once the
        # envelope is decoded, after this hook.
        if self._tracer is not None:
            ctx.scratch[_STARTED] = time.time_ns()

    def debate_event(self, ctx: RequestContext, event: ev.DebateEvent) -> None:
        if self._tracer is None:
            return
        debate = self._debate_span(ctx)
        if isinstance(event, ev.RoundStarted):
            self._open_round(ctx, debate, event)
        elif isinstance(event, ev.RoundCompleted):
            self._close_round(ctx, event)
        elif isinstance(event, CallEvent):
            self._call_span(ctx, debate, event)
        else:
            _annotate(debate, event)

    def outgoing_headers(self, ctx: RequestContext) -> Mapping[str, str]:
        if self._tracer is None:
            return {}
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(self._debate_span(ctx)))
        return carrier

    def request_finished(self, ctx: RequestContext, outcome: Settlement,
                         result: HandlerResult | None, duration_s: float) -> None:
        if self._tracer is None:
            return
        debate = self._debate_span(ctx)
        for span in self._rounds(ctx).values():  # a debate that failed or stopped mid-round
            span.set_status(Status(StatusCode.ERROR, "the debate ended during this round"))
            span.end()
        self._rounds(ctx).clear()
        debate.set_attribute("debatebus.outcome", outcome)
        if ctx.request_id is not None:
            debate.set_attribute("debatebus.request_id", ctx.request_id)
        if outcome in _FAILED_OUTCOMES:
            error = result.fields.get("debateError") if result is not None else None
            debate.set_status(Status(StatusCode.ERROR, redact(str(error or outcome))))
        debate.end()

    # ---- spans --------------------------------------------------------------------------------

    def _debate_span(self, ctx: RequestContext) -> Span:
        span: Span | None = ctx.scratch.get(_DEBATE)
        if span is None:
            assert self._tracer is not None
            span = self._tracer.start_span(
                f"debate {ctx.debate_name or ctx.event_type}",
                # An empty context when there is no traceparent: a root span, never a child of
                # whatever happens to be current in the worker.
                context=_PROPAGATOR.extract(ctx.headers, context=Context()),
                kind=SpanKind.CONSUMER,
                attributes=_request_attributes(ctx),
                start_time=ctx.scratch.get(_STARTED),
            )
            ctx.scratch[_DEBATE] = span
        return span

    def _rounds(self, ctx: RequestContext) -> dict[int, Span]:
        rounds: dict[int, Span] = ctx.scratch.setdefault(_ROUNDS, {})
        return rounds

    def _open_round(self, ctx: RequestContext, debate: Span, event: ev.RoundStarted) -> None:
        assert self._tracer is not None
        self._rounds(ctx)[event.round] = self._tracer.start_span(
            f"round {event.round}", context=trace.set_span_in_context(debate),
            attributes={"debatebus.round": event.round, "debatebus.phase": event.phase})

    def _close_round(self, ctx: RequestContext, event: ev.RoundCompleted) -> None:
        span = self._rounds(ctx).pop(event.round, None)
        if span is not None:
            span.set_attributes(_usage_attributes(event.usage))
            span.end()

    def _call_span(self, ctx: RequestContext, debate: Span, event: CallEvent) -> None:
        assert self._tracer is not None
        end = time.time_ns()
        number = call_round(event)
        parent = self._rounds(ctx).get(number, debate) if number is not None else debate
        purpose = CALL_PURPOSES[type(event)]
        span = self._tracer.start_span(
            f"{purpose} {event.speaker}", context=trace.set_span_in_context(parent),
            kind=SpanKind.CLIENT, attributes=_call_attributes(event, purpose, number),
            start_time=end - int(event.duration_ms * 1_000_000))
        if isinstance(event, ev.TurnFailed):
            span.set_status(Status(StatusCode.ERROR, redact(event.error)))
        span.end(end_time=end)


def _request_attributes(ctx: RequestContext) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.operation.type": "process",
        "messaging.destination.name": ctx.event_type,
        "messaging.message.id": ctx.delivery_id,
        "debatebus.deliveries": ctx.deliveries,
    }
    if ctx.request_id is not None:
        attributes["debatebus.request_id"] = ctx.request_id
    return attributes


def _usage_attributes(usage: TokenUsage) -> dict[str, Any]:
    return {"gen_ai.usage.input_tokens": usage.prompt_tokens,
            "gen_ai.usage.output_tokens": usage.completion_tokens}


def _call_attributes(event: CallEvent, purpose: str, number: int | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "debatebus.participant": event.speaker,
        "debatebus.purpose": purpose,
        "debatebus.debate_id": event.debate_id,
        **_usage_attributes(event.usage),
    }
    if event.model:
        attributes["gen_ai.request.model"] = event.model
    if number is not None:
        attributes["debatebus.round"] = number
    return attributes


def _annotate(debate: Span, event: ev.DebateEvent) -> None:
    """Debate-level facts from the other events, as attributes of the debate span."""
    if isinstance(event, ev.DebateStarted):
        debate.set_attributes({
            "debatebus.debate_id": event.debate_id, "debatebus.debate_name": event.debate_name,
            "debatebus.protocol": event.protocol, "debatebus.participants": event.participants,
            "debatebus.max_rounds": event.max_rounds,
            "debatebus.resumed_from_round": event.resumed_from_round})
    elif isinstance(event, ev.PhiUpdate):
        debate.set_attribute("debatebus.phi_hat", event.phi_hat)
    elif isinstance(event, ev.DebateCompleted | ev.DebateFailed):
        debate.set_attributes({"debatebus.rounds": event.rounds,
                               **_usage_attributes(event.token_usage)})
