"""Logs with the standard ``logging`` module: text or one JSON object per line, request and debate
ids on every line logged while a request is handled, API keys redacted, transcripts left out.

``configure_logging(format="json")`` installs one handler on the root logger;
``app.add_observer(LoggingObserver())`` logs one line as each request ends (and its debate's start
when resumed or redelivered) and lets every line logged while handling a request (engine, LLM
clients, transports) carry its ids.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import sys
from collections.abc import Mapping
from typing import IO, Any, Final, Literal

from debatebus._redaction import redact
from debatebus.exceptions import ConfigError
from debatebus.observability._events import call_round
from debatebus.observability._observer import Observer, RequestContext, Settlement
from debatebus.schemas import events as ev
from debatebus.schemas.result import HandlerResult

_HANDLER_NAME: Final = "debatebus"
_IDS: Final = ("requestId", "debateId", "eventType")
_DEBATE_ID: Final = "log.debate_id"  # RequestContext.scratch key
#: Free text (errors, questions) is cut to this many characters: enough to act on, not a transcript.
_SNIPPET: Final = 300

#: The request being handled in this task (and the tasks it starts), for ``ContextFilter``.
_CURRENT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "debatebus_request", default=None)

#: Attributes every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", *_IDS}


def _snippet(text: str) -> str:
    text = redact(text)
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "…"


# ---- filters and formatters ----------------------------------------------------------------------


class RedactingFilter(logging.Filter):
    """Redacts secrets in a record's message, traceback and string extras, for every handler
    that formats it after this filter ran (records are shared between handlers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # bad %-args: leave the record to the handler's own error reporting
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        extras = vars(record)
        for name in extras.keys() - _STANDARD:
            value = extras[name]
            if isinstance(value, str):
                extras[name] = redact(value)
        return True


class ContextFilter(logging.Filter):
    """Puts ``requestId``, ``debateId`` and ``eventType`` on every record: from ``extra=`` when
    given, else from the request this task is handling (set by ``LoggingObserver``), else None."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _CURRENT.get()
        ids = _ids(ctx) if ctx is not None else dict.fromkeys(_IDS)
        for name in _IDS:
            if getattr(record, name, None) is None:
                setattr(record, name, ids[name])
        return True


def _ids(ctx: RequestContext) -> dict[str, str | None]:
    return {"requestId": ctx.request_id, "debateId": ctx.scratch.get(_DEBATE_ID),
            "eventType": ctx.event_type}


def _timestamp(created: float) -> str:
    moment = dt.datetime.fromtimestamp(created, dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, requestId, debateId, eventType, then
    the record's ``extra`` fields and ``exc`` (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **{name: getattr(record, name, None) for name in _IDS},
        }
        entry.update((k, v) for k, v in vars(record).items()
                     if k not in _STANDARD and not k.startswith("_"))
        if record.exc_info or record.exc_text:
            entry["exc"] = record.exc_text or self.formatException(record.exc_info)  # type: ignore[arg-type]
        if record.stack_info:
            entry["stack"] = record.stack_info
        # Redacting the finished line too covers handlers set up without RedactingFilter.
        return redact(json.dumps(entry, default=str, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    """``2025-01-01 12:00:00,000 INFO debatebus.requests: message [requestId=… debateId=…]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = " ".join(f"{name}={value}" for name in _IDS[:2]
                       if (value := getattr(record, name, None)) is not None)
        return redact(f"{line} [{ids}]" if ids else line)


def configure_logging(format: Literal["text", "json"] | str = "text", level: int | str = "INFO",
                      *, stream: IO[str] | None = None) -> logging.Handler:
    """Log to ``stream`` (stderr) from the root logger, as text or JSON lines, with ids and
    redaction. Calling it again replaces the handler it installed before; returns the handler."""
    if format not in ("text", "json"):
        raise ConfigError(f"log format must be 'text' or 'json', not {format!r}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    handler.addFilter(RedactingFilter())
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler


# ---- the observer --------------------------------------------------------------------------------

_QUIET_OUTCOMES: Final = ("completed", "replayed")
#: Events that report one model call (logged at DEBUG).
_CALL_EVENTS: Final = (ev.FramingCompleted, ev.TurnCompleted, ev.SynthesisCompleted,
                       ev.VerdictReached)
#: The events logged above DEBUG: a debate's start (when resumed or redelivered) and failed turns.
#: Every other event is logged at DEBUG, or not at all.
_ABOVE_DEBUG: Final[frozenset[type[ev.DebateEvent]]] = frozenset((ev.DebateStarted, ev.TurnFailed))


class LoggingObserver(Observer):
    """Logs each request's end (INFO, or WARNING when it did not complete: one line per request),
    its debate's start (INFO when resumed or redelivered, else DEBUG), calls and rounds (DEBUG) and
    failed turns (WARNING), with its ids on every line.

    Debate text — question, turns, verdicts, output — is logged only with ``log_transcripts=True``:
    it can be long, and it is the users' data.
    """

    def __init__(self, logger: logging.Logger | None = None, *,
                 log_transcripts: bool = False) -> None:
        self.log = logger or logging.getLogger("debatebus.requests")
        self.log_transcripts = log_transcripts

    def request_started(self, ctx: RequestContext) -> None:
        # No line yet: the request id is only known once the envelope is decoded. The context is
        # what makes every later line of this task (and of the tasks it starts) carry the ids.
        _CURRENT.set(ctx)

    def debate_event_types(self) -> frozenset[type[ev.DebateEvent]] | None:
        # Unless DEBUG is on, the engine need not build the events logged only at DEBUG.
        return None if self.log.isEnabledFor(logging.DEBUG) else _ABOVE_DEBUG

    def debate_event(self, ctx: RequestContext, event: ev.DebateEvent) -> None:
        # Called for every event another observer reads too: the common case (an event not
        # logged while DEBUG is off) is one type test and one cached level check.
        if type(event) not in _ABOVE_DEBUG and not self.log.isEnabledFor(logging.DEBUG):
            return
        ctx.scratch.setdefault(_DEBATE_ID, event.debate_id)
        if isinstance(event, ev.DebateStarted):
            self._started(ctx, event)
        elif isinstance(event, ev.TurnFailed):
            self._emit(ctx, logging.WARNING, "turn by %s failed in round %d: %s",
                       event.speaker, event.round, _snippet(event.error))
        elif isinstance(event, ev.RoundCompleted):
            self._emit(ctx, logging.DEBUG, "round %d (%s) completed: %d tokens",
                       event.round, event.phase, event.usage.total_tokens)
        elif isinstance(event, _CALL_EVENTS):
            self._call(ctx, event)

    def _started(self, ctx: RequestContext, event: ev.DebateStarted) -> None:
        # One INFO line per request (its end) unless the start is news: a resumed debate or a
        # redelivered request. Every other start is at DEBUG.
        level = (logging.INFO if event.resumed_from_round or ctx.deliveries > 1
                 else logging.DEBUG)
        if not self.log.isEnabledFor(level):
            return
        resumed = (f", resumed after round {event.resumed_from_round}"
                   if event.resumed_from_round else "")
        question = f": {event.question}" if self.log_transcripts else ""
        self._emit(ctx, level, "debate %r started (delivery %d, %d participants, up to %d "
                   "rounds%s)%s", event.debate_name, ctx.deliveries, len(event.participants),
                   event.max_rounds, resumed, question)

    def _call(self, ctx: RequestContext, event: ev.FramingCompleted | ev.TurnCompleted
              | ev.SynthesisCompleted | ev.VerdictReached) -> None:
        number = call_round(event)
        where = f" in round {number}" if number is not None else ""
        text = ""
        if self.log_transcripts:
            said = json.dumps(event.verdict) if isinstance(event, ev.VerdictReached) else event.text
            text = f": {said}"
        self._emit(ctx, logging.DEBUG, "%s by %s%s (%s, %.0f ms, %d tokens)%s",
                   event.kind, event.speaker, where, event.model or "model?",
                   event.duration_ms, event.usage.total_tokens, text)

    def request_finished(self, ctx: RequestContext, outcome: Settlement,
                         result: HandlerResult | None, duration_s: float) -> None:
        fields = result.fields if result is not None else None
        if fields is not None and isinstance(fields.get("debateId"), str):
            ctx.scratch.setdefault(_DEBATE_ID, fields["debateId"])
        level = logging.INFO if outcome in _QUIET_OUTCOMES else logging.WARNING
        self._emit(ctx, level, "request %s after %.2f s (delivery %d)%s", outcome, duration_s,
                   ctx.deliveries, self._summary(ctx, outcome, fields),
                   outcome=outcome, durationS=round(duration_s, 3), deliveries=ctx.deliveries)
        _CURRENT.set(None)

    def _summary(self, ctx: RequestContext, outcome: Settlement,
                 result: Mapping[str, Any] | None) -> str:
        if outcome == "dead_lettered":
            return f": moved to {ctx.dead_letter_topic}"
        if outcome == "unsettled":
            return ": released unsettled, to be handed out again"
        if result is None:
            return ""
        if outcome == "replayed":
            parts = ": answered from the store or a run in flight, no model call"
            if result.get("debateStatus") == "failed":
                parts += f", a failed debate: {_snippet(str(result.get('debateError')))}"
            return parts
        usage = result.get("debateTokenUsage") or {}
        parts = f": {result.get('debateRounds', 0)} rounds, {usage.get('totalTokens', 0)} tokens"
        if result.get("debateResumedFromRound"):
            parts += f", resumed after round {result['debateResumedFromRound']}"
        if result.get("debateError"):
            parts += f", error: {_snippet(str(result['debateError']))}"
        if result.get("debateRetryable"):
            parts += " (may pass: not stored, a resend or replay runs it again)"
        if self.log_transcripts and result.get("debateOutput"):
            parts += f", output: {result['debateOutput']}"
        return parts

    def _emit(self, ctx: RequestContext, level: int, message: str, *args: Any,
              **fields: Any) -> None:
        # The record is made here, not by Logger.log, which would walk the stack to find the
        # caller (findCaller) on every request: the record names this method instead.
        log = self.log
        if log.isEnabledFor(level):
            log.handle(log.makeRecord(log.name, level, __file__, _EMIT_LINE, message, args, None,
                                      "_emit", {**_ids(ctx), **fields}))


#: Where the records ``LoggingObserver`` makes say they come from (its ``_emit``).
_EMIT_LINE: Final = LoggingObserver._emit.__code__.co_firstlineno
