"""Typed debate events: what ``on_event`` receives and what the worker publishes on ``debate:events``.

Every event carries the debate id and a sequence number that increases by 1 per event of a debate.
On the wire each is a JSON object tagged by ``type`` (``"turn_completed"``, …) with camelCase fields.
Versioning rule: new fields get defaults; a field's type never changes.

A sub-debate's own events carry its ``depth`` (1 for a child, 0 — the default — for a top-level
debate); its parent reports it with ``sub_debate_*`` events.

``TurnDelta`` is not a debate event: the engine builds none and observers never see one. A handler
asked to stream its turns (``as_handler(stream_turns=True)``) publishes them on the same topic
while a turn is written; they are ephemeral (never checkpointed) and their ``seq`` counts within
one writing of one turn. ``BusEvent`` is either, as read from the topic.
"""

from __future__ import annotations

from typing import Any

import msgspec

from debatebus._usage import ZERO_USAGE, TokenUsage
from debatebus.schemas.cost import DebateCost

__all__ = [
    "BUS_EVENT_DECODER",
    "EVENT_DECODER",
    "EVENT_TYPES",
    "BusEvent",
    "DebateCompleted",
    "DebateEvent",
    "DebateFailed",
    "DebateStarted",
    "FramingCompleted",
    "PhiUpdate",
    "RoundCompleted",
    "RoundStarted",
    "SubDebateCompleted",
    "SubDebateFailed",
    "SubDebateSkipped",
    "SubDebateStarted",
    "SynthesisCompleted",
    "TurnCompleted",
    "TurnDelta",
    "TurnFailed",
    "TurnRequested",
    "VerdictReached",
]


class _Event(msgspec.Struct, tag_field="type", rename="camel", kw_only=True, gc=False):
    debate_id: str
    seq: int
    request_id: str | None = None
    depth: int = 0

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


class TurnRequested(_Event, tag="turn_requested", kw_only=True):
    """A person's turn was asked for (docs/people.md): its request is on ``event_type`` under
    ``turn_key`` (its ``requestId``) with ``message_id`` (its ``messageId``, which a reply names
    as its ``causationId``), answerable until ``deadline`` (ISO 8601, UTC)."""

    speaker: str
    round: int
    turn_key: str
    event_type: str
    message_id: str
    deadline: str
    prompt: str


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
    #: What the debate cost, its sub-debates included, when its prices priced every model used.
    cost: DebateCost | None = None


class DebateFailed(_Event, tag="debate_failed", kw_only=True):
    rounds: int
    error: str
    token_usage: TokenUsage = ZERO_USAGE
    duration_ms: float = 0.0
    #: The failure may pass (a provider error, a timeout): a resend or replay runs it again.
    retryable: bool = False
    #: What stopped it when a budget limit (``max_calls``, ``max_total_tokens``, ``max_cost``) or
    #: a fleet spend limit (``spend_limit``) did.
    stop_reason: str | None = None
    cost: DebateCost | None = None


class _SubDebateEvent(_Event, kw_only=True):
    """About one child debate of this debate: its domain, who asked, and its request id (also its
    debate id)."""

    domain: str
    requested_by: str
    child_request_id: str


class SubDebateStarted(_SubDebateEvent, tag="sub_debate_started", kw_only=True):
    participants: list[str]  # empty when the child is served on the bus (its worker decides)
    child_depth: int


class SubDebateCompleted(_SubDebateEvent, tag="sub_debate_completed", kw_only=True):
    synthesis: str
    usage: TokenUsage = ZERO_USAGE


class SubDebateFailed(_SubDebateEvent, tag="sub_debate_failed", kw_only=True):
    """The child failed or timed out: the requester keeps its position without it."""

    error: str
    usage: TokenUsage = ZERO_USAGE


class SubDebateSkipped(_Event, tag="sub_debate_skipped", kw_only=True):
    """A sub-debate marker that started nothing (a cap reached, an unknown domain, a second marker
    in one position): ignored, and said so here."""

    domain: str
    requested_by: str
    reason: str


class TurnDelta(_Event, tag="turn_delta", kw_only=True):
    """A piece of a turn's text while it is written (round 0: the framing or the audience).

    ``seq`` numbers the deltas of one writing of the turn from 1. A delta with ``replace`` (the
    first one always) starts the turn's text afresh; every other one extends it. ``final``: the
    turn is committed (or failed), and the text so far is exactly its text in the transcript
    (a failed turn's is empty); nothing more comes for it, unless a later run writes it again.
    ``rerun``: a retry of the request (its worker died, or the delivery was released) writes
    again a turn an earlier attempt may have streamed already."""

    round: int
    speaker: str
    purpose: str
    text: str
    replace: bool = False
    final: bool = False
    rerun: bool = False


DebateEvent = (
    DebateStarted
    | FramingCompleted
    | RoundStarted
    | TurnCompleted
    | TurnFailed
    | TurnRequested
    | VerdictReached
    | RoundCompleted
    | PhiUpdate
    | SynthesisCompleted
    | SubDebateStarted
    | SubDebateCompleted
    | SubDebateFailed
    | SubDebateSkipped
    | DebateCompleted
    | DebateFailed
)

#: What the events topic carries: debate events and turn deltas.
BusEvent = DebateEvent | TurnDelta

#: Every kind of message on the events topic.
EVENT_TYPES: tuple[type[_Event], ...] = (
    DebateStarted,
    FramingCompleted,
    RoundStarted,
    TurnCompleted,
    TurnFailed,
    TurnRequested,
    VerdictReached,
    RoundCompleted,
    PhiUpdate,
    SynthesisCompleted,
    SubDebateStarted,
    SubDebateCompleted,
    SubDebateFailed,
    SubDebateSkipped,
    DebateCompleted,
    DebateFailed,
    TurnDelta,
)

#: Decodes a debate event (not a turn delta: ``BUS_EVENT_DECODER`` reads both).
EVENT_DECODER: msgspec.json.Decoder[DebateEvent] = msgspec.json.Decoder(DebateEvent)
BUS_EVENT_DECODER: msgspec.json.Decoder[BusEvent] = msgspec.json.Decoder(BusEvent)
