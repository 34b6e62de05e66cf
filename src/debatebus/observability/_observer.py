"""Hooks through which metrics, traces and logs watch a worker, without the worker knowing them.

An ``Observer`` gets every request's lifecycle and, while a debate runs, its events (turns,
verdicts, rounds…). Hooks are synchronous and must be cheap: they run on the event loop. A hook
that raises is logged once and ignored (``fan_out``): it never changes how a request is settled.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from debatebus.schemas.events import DebateEvent
from debatebus.schemas.result import HandlerResult

log = logging.getLogger("debatebus.worker")

#: How a request's delivery ended, as ``request_finished`` reports it.
Settlement = Literal["completed", "failed", "replayed", "bad_input", "dead_lettered", "unsettled"]


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

    def request_finished(self, ctx: RequestContext, outcome: Settlement,
                         result: HandlerResult | None, duration_s: float) -> None:
        """The delivery was settled with this outcome and ``result`` (its published fields and
        status; None when nothing was published), or released unsettled (``"unsettled"``)."""

    def outgoing_headers(self, ctx: RequestContext) -> Mapping[str, str]:
        """Headers to put on the result envelope (e.g. a ``traceparent`` for the next hop)."""
        return {}


def fan_out(observers: Sequence[Observer]) -> Observer | None:
    """One observer calling all of them, or None when there are none (the worker's fast path).
    Every call is guarded here, the one place the worker calls observers through: an observer
    that raises is logged once per hook (with its traceback) and otherwise ignored, so it never
    changes how a request is settled, nor keeps the other observers from their call."""
    if not observers:
        return None
    return _FanOut(tuple(observers))


class _FanOut(Observer):
    def __init__(self, observers: tuple[Observer, ...]) -> None:
        self.observers = observers
        self._logged: set[tuple[int, str]] = set()  # (observer's index, hook) logged already

    def _raised(self, index: int, hook: str) -> None:
        """Called in the ``except`` of a hook that raised: log it the first time only."""
        if (index, hook) in self._logged:
            return
        self._logged.add((index, hook))
        log.error("observer %r raised in %s; ignored (the request is settled as if it had not), "
                  "and its later errors in %s are not logged", self.observers[index], hook, hook,
                  exc_info=True)

    def request_started(self, ctx: RequestContext) -> None:
        for i, o in enumerate(self.observers):
            try:
                o.request_started(ctx)
            except Exception:
                self._raised(i, "request_started")

    def debate_event(self, ctx: RequestContext, event: DebateEvent) -> None:
        for i, o in enumerate(self.observers):
            try:
                o.debate_event(ctx, event)
            except Exception:
                self._raised(i, "debate_event")

    def debate_event_types(self) -> frozenset[type[DebateEvent]] | None:
        wanted: set[type[DebateEvent]] = set()
        for i, o in enumerate(self.observers):
            try:
                types = o.debate_event_types()
            except Exception:
                self._raised(i, "debate_event_types")
                types = None  # it reads what it reads: every kind
            if types is None:
                return None
            wanted |= types
        return frozenset(wanted)

    def request_finished(self, ctx: RequestContext, outcome: Settlement,
                         result: HandlerResult | None, duration_s: float) -> None:
        for i, o in enumerate(self.observers):
            try:
                o.request_finished(ctx, outcome, result, duration_s)
            except Exception:
                self._raised(i, "request_finished")

    def outgoing_headers(self, ctx: RequestContext) -> Mapping[str, str]:
        merged: dict[str, str] = {}
        for i, o in enumerate(self.observers):
            try:
                merged.update(o.outgoing_headers(ctx))
            except Exception:
                self._raised(i, "outgoing_headers")
        return merged
