"""Recent debates as the live page sees them, rebuilt from the events on ``debate:events``.

Events are kept as decoded JSON objects rather than typed structs: a page that dropped events of a
type it does not know yet (from a newer worker) would show less than the bus carries.

Turn deltas (``turn_delta``, from a handler that streams its turns) are not kept as events: each
turn being written keeps its text so far (``DebateRecord.typing``) until it is committed, and the
streams listening get every delta as it comes.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

#: Bounds memory for a debate that never ends (or a producer that floods one id).
MAX_EVENTS_PER_DEBATE: Final = 5000
#: Turns of one debate being written at once, and the characters kept of each (the same bound).
MAX_TYPING: Final = 64
MAX_TYPING_CHARS: Final = 200_000
#: Events a slow page may fall behind by before its stream is cut (it reconnects and catches up).
LISTENER_BACKLOG: Final = 1000
_MAX_ID_LENGTH: Final = 256

Event = dict[str, Any]
_CALL_EVENTS: Final = frozenset(
    {"framing_completed", "turn_completed", "turn_failed", "verdict", "synthesis_completed"}
)
DELTA: Final = "turn_delta"
_decode = msgspec.json.Decoder().decode


def _zero_usage() -> dict[str, int]:
    return {"promptTokens": 0, "completionTokens": 0, "totalTokens": 0, "cacheReadTokens": 0,
            "cacheWriteTokens": 0}


def _usage(value: Any) -> dict[str, int]:
    usage = _zero_usage()
    if isinstance(value, dict):
        for name in usage:
            amount = value.get(name)
            if isinstance(amount, int) and not isinstance(amount, bool):
                usage[name] = amount
    return usage


@dataclass(slots=True)
class DebateRecord:
    """One debate: a summary kept current as events arrive, and the events themselves."""

    debate_id: str
    request_id: str | None = None
    name: str = ""
    question: str = ""
    protocol: str = ""
    participants: list[str] = field(default_factory=list)
    max_rounds: int = 0
    status: str = "running"
    rounds: int = 0
    turns: int = 0
    tokens: dict[str, int] = field(default_factory=_zero_usage)
    phi_hat: float | None = None
    phi_level: str | None = None
    verdict: dict[str, Any] | None = None
    error: str | None = None
    cost: dict[str, Any] | None = None
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    events: list[Event] = field(default_factory=list)
    truncated: bool = False
    #: Each turn being written (``_typing_key``): its text so far, as one ``replace`` delta.
    typing: dict[str, Event] = field(default_factory=dict)

    def add(self, event: Event, at: float | None = None) -> int | None:
        """Record ``event`` (published at ``at``, seconds since the epoch; None: now); its
        index in ``events``, or None once the debate is at its cap."""
        self.updated_at = time.time() if at is None else at
        if self.request_id is None and isinstance(event.get("requestId"), str):
            self.request_id = event["requestId"]
        _APPLY.get(event["type"], _ignore)(self, event)
        if len(self.events) >= MAX_EVENTS_PER_DEBATE:
            self.truncated = True
            return None
        self.events.append(event)
        return len(self.events) - 1

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.debate_id, "requestId": self.request_id, "name": self.name,
            "question": self.question, "protocol": self.protocol, "participants": self.participants,
            "maxRounds": self.max_rounds, "status": self.status, "rounds": self.rounds,
            "turns": self.turns, "tokens": self.tokens, "phiHat": self.phi_hat,
            "phiLevel": self.phi_level, "verdict": self.verdict, "error": self.error,
            "cost": self.cost,
            "startedAt": self.started_at, "updatedAt": self.updated_at,
            "events": len(self.events), "truncated": self.truncated, "typing": len(self.typing),
        }


# ---- how each event type moves the summary ------------------------------------------------------


def _ignore(record: DebateRecord, event: Event) -> None:
    """Unknown types (a newer worker's) are kept and streamed, only not summarised."""


def _started(record: DebateRecord, event: Event) -> None:
    record.status = "running"  # again, when another worker resumes the debate
    record.typing.clear()  # what a dead attempt was writing: the new one writes it again
    record.question = str(event.get("question", record.question))
    record.name = str(event.get("debateName", record.name))
    record.protocol = str(event.get("protocol", record.protocol))
    participants = event.get("participants")
    if isinstance(participants, list):
        record.participants = [str(p) for p in participants]
    if isinstance(event.get("maxRounds"), int):
        record.max_rounds = event["maxRounds"]


def _call(record: DebateRecord, event: Event) -> None:
    _written(record, event)
    # A running total until the debate reports its own (which also counts resumed work).
    usage = _usage(event.get("usage"))
    for name, amount in usage.items():
        record.tokens[name] += amount
    if event["type"] in ("turn_completed", "turn_failed"):
        record.turns += 1
    if event["type"] == "verdict" and isinstance(event.get("verdict"), dict):
        record.verdict = event["verdict"]


def _round(record: DebateRecord, event: Event) -> None:
    number = event.get("round")
    if isinstance(number, int) and event["type"] == "round_completed":
        record.rounds = max(record.rounds, number)


def _phi(record: DebateRecord, event: Event) -> None:
    if isinstance(event.get("phiHat"), int | float):
        record.phi_hat = float(event["phiHat"])
        record.phi_level = str(event.get("level", ""))


def _written(record: DebateRecord, event: Event) -> None:
    """A reported turn is no longer being written (should its final delta have been lost)."""
    if not record.typing:
        return
    speaker = event.get("speaker")
    if event["type"] == "synthesis_completed":
        done = [k for k, d in record.typing.items()
                if d.get("purpose") == "synthesis" and d.get("speaker") == speaker]
    else:
        number = event.get("round", 0)
        done = [k for k, d in record.typing.items()
                if d.get("round") == number and d.get("speaker") == speaker]
    for key in done:
        del record.typing[key]


def _typing_key(delta: Event) -> str:
    return f"{delta.get('round')}/{delta.get('speaker')}/{delta.get('purpose')}"


def _delta(record: DebateRecord, delta: Event) -> None:
    """Apply a turn delta to the text of the turn being written: ``replace`` starts it afresh,
    another delta extends it (one already applied, by its ``seq``, is skipped); ``final`` ends
    it."""
    key, seq, text = _typing_key(delta), delta.get("seq"), delta.get("text")
    if not isinstance(seq, int) or not isinstance(text, str):
        return
    typing = record.typing
    current = typing.get(key)
    if delta.get("final") is True:
        typing.pop(key, None)
    elif delta.get("replace") is True or current is None:
        if current is not None or len(typing) < MAX_TYPING:
            typing[key] = {**delta, "replace": True, "text": text[:MAX_TYPING_CHARS]}
    elif seq > current["seq"] and len(current["text"]) < MAX_TYPING_CHARS:
        current["text"] = (current["text"] + text)[:MAX_TYPING_CHARS]
        current["seq"] = seq


def _finished(record: DebateRecord, event: Event) -> None:
    record.typing.clear()
    record.status = "completed" if event["type"] == "debate_completed" else "failed"
    if isinstance(event.get("rounds"), int):
        record.rounds = event["rounds"]
    if "tokenUsage" in event:
        record.tokens = _usage(event["tokenUsage"])
    if isinstance(event.get("cost"), dict):
        record.cost = event["cost"]
    if event["type"] == "debate_failed":
        record.error = str(event.get("error", ""))


_APPLY: Final[dict[str, Callable[[DebateRecord, Event], None]]] = {
    "debate_started": _started,
    **dict.fromkeys(_CALL_EVENTS, _call),
    "round_completed": _round,
    "phi_update": _phi,
    "debate_completed": _finished,
    "debate_failed": _finished,
}


# ---- listeners ----------------------------------------------------------------------------------


class Listener:
    """One open stream's inbox: events by their index, turn deltas with none (they are not kept).
    Never blocks the pump: a page that falls too far behind is cut off (``overflowed``) and
    catches up from the stored events, and the turns being written, when its EventSource
    reconnects."""

    def __init__(self, backlog: int = LISTENER_BACKLOG) -> None:
        self.pending: deque[tuple[int | None, Event]] = deque()
        self.backlog = backlog
        self.overflowed = False
        self._wake = asyncio.Event()

    def push(self, index: int | None, event: Event) -> None:
        if len(self.pending) >= self.backlog:
            self.overflowed = True
        else:
            self.pending.append((index, event))
        self._wake.set()

    async def next_batch(self, timeout: float) -> list[tuple[int | None, Event]]:
        """What arrived since the last call; empty after ``timeout`` seconds of silence."""
        if not self.pending and not self.overflowed:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                return []
        self._wake.clear()
        batch = list(self.pending)
        self.pending.clear()
        return batch


# ---- the store ----------------------------------------------------------------------------------


def parse_event(body: bytes) -> Event | None:
    """The event in ``body``, or None when it is not one (not JSON, no type or debateId)."""
    try:
        event = _decode(body)
    except msgspec.DecodeError:
        return None
    if not isinstance(event, dict):
        return None
    debate_id = event.get("debateId")
    if not isinstance(event.get("type"), str) or not isinstance(debate_id, str):
        return None
    return event if 0 < len(debate_id) <= _MAX_ID_LENGTH else None


class DebateStore:
    """The ``history`` most recently active debates, and the streams listening to them."""

    def __init__(self, history: int = 200) -> None:
        if history < 1:
            raise ValueError(f"history must be ≥ 1, got {history}")
        self.history = history
        self.received = 0
        self.ignored = 0
        self._debates: OrderedDict[str, DebateRecord] = OrderedDict()
        self._listeners: dict[str, set[Listener]] = {}

    def ingest(self, body: bytes, at: float | None = None) -> None:
        """Take one message of the events topic, published at ``at`` (seconds since the epoch;
        None: now)."""
        self.received += 1
        event = parse_event(body)
        if event is None:
            self.ignored += 1
            return
        self.add(event, at)

    def add(self, event: Event, at: float | None = None) -> None:
        record = self._record(event["debateId"], at)
        if event["type"] == DELTA:
            record.updated_at = time.time() if at is None else at
            _delta(record, event)
            index = None
        else:
            index = record.add(event, at)
            if index is None:
                return
        for listener in self._listeners.get(record.debate_id, ()):
            listener.push(index, event)

    def _record(self, debate_id: str, at: float | None) -> DebateRecord:
        record = self._debates.get(debate_id)
        if record is None:
            record = self._debates[debate_id] = DebateRecord(debate_id)
            if at is not None:
                record.started_at = record.updated_at = at
            while len(self._debates) > self.history:
                self._debates.popitem(last=False)
        else:
            self._debates.move_to_end(debate_id)  # evict the least recently active first
        return record

    def get(self, debate_id: str) -> DebateRecord | None:
        return self._debates.get(debate_id)

    def recent(self) -> list[dict[str, Any]]:
        """Summaries, most recently started first."""
        records = sorted(self._debates.values(), key=lambda r: r.started_at, reverse=True)
        return [r.summary() for r in records]

    def __len__(self) -> int:
        return len(self._debates)

    def listen(self, debate_id: str) -> Listener:
        """A listener for ``debate_id``, which need not exist yet (a page may open it first)."""
        listener = Listener()
        self._listeners.setdefault(debate_id, set()).add(listener)
        return listener

    def unlisten(self, debate_id: str, listener: Listener) -> None:
        listeners = self._listeners.get(debate_id)
        if listeners is not None:
            listeners.discard(listener)
            if not listeners:
                del self._listeners[debate_id]
