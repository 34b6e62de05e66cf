"""Hooks through which metrics, traces and logs watch a worker, without the worker knowing them.

An ``Observer`` gets every request's lifecycle and, while a debate runs, its events (turns,
verdicts, rounds…). Hooks are synchronous and must be cheap: they run on the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from debatebus.schemas.events import DebateEvent

if TYPE_CHECKING:
    from debatebus.handlers.contract import HandlerResult

__all__ = ["Observer", "Outcome", "RequestContext", "fan_out"]

Outcome = Literal["completed", "failed", "replayed", "bad_input", "dead_lettered", "unsettled"]


@dataclass(slots=True)
class RequestContext:
    """One delivery being handled. ``headers`` are the request envelope's (W3C ``traceparent``…);
    ``scratch`` is for observers to keep per-request state (e.g. an open span)."""

    event_type: str
    delivery_id: str
    deliveries: int
    request_id: str | None = None
    debate_name: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    scratch: dict[str, Any] = field(default_factory=dict)
    #: Where a dead-lettered request went, as the broker names it (``debate.request.dlq`` on
    #: Kafka); set before ``request_finished`` reports ``"dead_lettered"``.
    dead_letter_topic: str | None = None


class Observer:
    """No-op base: override what you need."""

    def request_started(self, ctx: RequestContext) -> None:
        """A delivery was taken for handling (``ctx.deliveries > 1`` means a redelivery)."""

    def debate_event(self, ctx: RequestContext, event: DebateEvent) -> None:
        """An engine event of the debate this request runs (in order, per debate)."""

    def debate_event_types(self) -> frozenset[type[DebateEvent]] | None:
        """The kinds of event ``debate_event`` reads, asked as each request starts: the engine
        builds no other kind for it (unless another observer, or ``debate:events``, wants it).
        None, the default: every kind."""
        return None

    def request_finished(self, ctx: RequestContext, outcome: Outcome,
                         result: HandlerResult | None, duration_s: float) -> None:
        """The delivery was settled with this outcome and ``result`` (its published fields and
        status; None when nothing was published), or released unsettled (``"unsettled"``)."""

    def outgoing_headers(self, ctx: RequestContext) -> Mapping[str, str]:
        """Headers to put on the result envelope (e.g. a ``traceparent`` for the next hop)."""
        return {}


def fan_out(observers: Sequence[Observer]) -> Observer | None:
    """One observer calling all of them, or None when there are none (the worker's fast path)."""
    if not observers:
        return None
    if len(observers) == 1:
        return observers[0]
    return _Many(tuple(observers))


class _Many(Observer):
    def __init__(self, observers: tuple[Observer, ...]) -> None:
        self.observers = observers

    def request_started(self, ctx: RequestContext) -> None:
        for o in self.observers:
            o.request_started(ctx)

    def debate_event(self, ctx: RequestContext, event: DebateEvent) -> None:
        for o in self.observers:
            o.debate_event(ctx, event)

    def debate_event_types(self) -> frozenset[type[DebateEvent]] | None:
        wanted: set[type[DebateEvent]] = set()
        for o in self.observers:
            types = o.debate_event_types()
            if types is None:
                return None
            wanted |= types
        return frozenset(wanted)

    def request_finished(self, ctx: RequestContext, outcome: Outcome,
                         result: HandlerResult | None, duration_s: float) -> None:
        for o in self.observers:
            o.request_finished(ctx, outcome, result, duration_s)

    def outgoing_headers(self, ctx: RequestContext) -> Mapping[str, str]:
        merged: dict[str, str] = {}
        for o in self.observers:
            merged.update(o.outgoing_headers(ctx))
        return merged
