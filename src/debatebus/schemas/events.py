"""Typed debate events: what ``on_event`` receives and what the worker publishes on ``debate:events``.

Every event carries the debate id and a sequence number that increases by 1 per event of a debate.
On the wire each is a JSON object tagged by ``type`` (``"turn_completed"``, …) with camelCase fields.
Versioning rule: new fields get defaults; a field's type never changes.
"""

from __future__ import annotations

from typing import Any

import msgspec

from debatebus.schemas.usage import ZERO_USAGE, TokenUsage

__all__ = [
    "EVENT_DECODER",
    "EVENT_TYPES",
    "DebateCompleted",
    "DebateEvent",
    "DebateFailed",
    "DebateStarted",
    "FramingCompleted",
    "PhiUpdate",
    "RoundCompleted",
    "RoundStarted",
    "SynthesisCompleted",
    "TurnCompleted",
    "TurnFailed",
    "VerdictReached",
]


class _Event(msgspec.Struct, tag_field="type", rename="camel", kw_only=True, gc=False):
    debate_id: str
    seq: int
    request_id: str | None = None

    @property
    def kind(self) -> str:
        """The event's type as on the wire (its ``type`` field): ``"turn_completed"``, …"""
        return str(self.__struct_config__.tag)


class _CallEvent(_Event, kw_only=True):
    """An event that reports one model call: which model, and how long it took."""

    model: str = ""
    duration_ms: float = 0.0


class DebateStarted(_Event, tag="debate_started", kw_only=True):
    question: str
    debate_name: str
    protocol: str
    participants: list[str]
    max_rounds: int
    resumed_from_round: int = 0


class FramingCompleted(_CallEvent, tag="framing_completed", kw_only=True):
    speaker: str
    text: str
    usage: TokenUsage = ZERO_USAGE


class RoundStarted(_Event, tag="round_started", kw_only=True):
    round: int
    phase: str


class TurnCompleted(_CallEvent, tag="turn_completed", kw_only=True):
    speaker: str
    round: int
    text: str
    usage: TokenUsage = ZERO_USAGE


class TurnFailed(_CallEvent, tag="turn_failed", kw_only=True):
    speaker: str
    round: int
    text: str
    error: str
    usage: TokenUsage = ZERO_USAGE


class VerdictReached(_CallEvent, tag="verdict", kw_only=True):
    round: int
    speaker: str = "judge"
    verdict: dict[str, Any]
    usage: TokenUsage = ZERO_USAGE


class RoundCompleted(_Event, tag="round_completed", kw_only=True):
    round: int
    phase: str
    usage: TokenUsage = ZERO_USAGE


class PhiUpdate(_Event, tag="phi_update", kw_only=True):
    phi_hat: float
    level: str


class SynthesisCompleted(_CallEvent, tag="synthesis_completed", kw_only=True):
    speaker: str
    text: str
    usage: TokenUsage = ZERO_USAGE


class DebateCompleted(_Event, tag="debate_completed", kw_only=True):
    rounds: int
    satisfied: bool
    output: str
    token_usage: TokenUsage = ZERO_USAGE
    duration_ms: float = 0.0


class DebateFailed(_Event, tag="debate_failed", kw_only=True):
    rounds: int
    error: str
    token_usage: TokenUsage = ZERO_USAGE
    duration_ms: float = 0.0


DebateEvent = (
    DebateStarted
    | FramingCompleted
    | RoundStarted
    | TurnCompleted
    | TurnFailed
    | VerdictReached
    | RoundCompleted
    | PhiUpdate
    | SynthesisCompleted
    | DebateCompleted
    | DebateFailed
)

EVENT_TYPES: tuple[type[_Event], ...] = (
    DebateStarted,
    FramingCompleted,
    RoundStarted,
    TurnCompleted,
    TurnFailed,
    VerdictReached,
    RoundCompleted,
    PhiUpdate,
    SynthesisCompleted,
    DebateCompleted,
    DebateFailed,
)

EVENT_DECODER: msgspec.json.Decoder[DebateEvent] = msgspec.json.Decoder(DebateEvent)
