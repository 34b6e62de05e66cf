"""What producers send: its validation (every problem becomes an InputError that says what to
fix), and ``Ask``, the identity of one request's question (what it asks, hashed, and where its
debate is kept)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from debatebus.exceptions import InputError
from debatebus.handlers._checkpointing import debate_key

DEFAULT_MAX_INPUT_BYTES = 64 * 1024
#: No request may ask for more rounds than this, whatever the debate's own cap (which applies too).
MAX_ROUNDS_LIMIT: Final = 1000
#: The deepest sub-debate a request may say it is (the debate's ``max_depth`` caps it in practice).
MAX_DEPTH_LIMIT: Final = 100


def read_question(payload: Any, max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
                  field: str = "input") -> str:
    """The debate's question: ``payload[field]`` (``input``, or the field a chained handler
    reads, such as ``debateOutput``)."""
    if not isinstance(payload, Mapping):
        raise InputError(
            f"payload must be a JSON object like {{\"{field}\": \"<question>\"}}, got "
            f"{type(payload).__name__}"
        )
    if field not in payload:
        raise InputError(f'payload.{field} is missing: send {{"payload": {{"{field}": '
                         '"<the debate question>"}}')
    question = payload[field]
    if not isinstance(question, str):
        raise InputError(f"payload.{field} must be a string (the debate question), got "
                         f"{type(question).__name__}")
    if not question.strip():
        raise InputError(f"payload.{field} is empty: send the debate question as a non-empty string")
    size = len(question.encode())
    if size > max_input_bytes:
        raise InputError(
            f"payload.{field} is {size} bytes, over the limit of {max_input_bytes}: shorten the "
            "question or raise max_input_bytes on the handler"
        )
    return question


def read_max_rounds(payload: Mapping[str, Any], cap: int) -> int | None:
    """The request's ``maxRounds``, never above the debate's own cap."""
    value = payload.get("maxRounds")
    if value is None:
        return None
    return min(_read_count(value, "payload.maxRounds", MAX_ROUNDS_LIMIT), cap)


def read_depth(payload: Mapping[str, Any]) -> int:
    """A sub-debate's ``depth`` (its parent's + 1, set by the parent's worker); 0 when absent.
    ``parentDebateId``, sent with it, is only echoed."""
    value = payload.get("depth")
    if value is None:
        return 0
    return _read_count(value, "payload.depth", MAX_DEPTH_LIMIT, lowest=0)


def _read_count(value: object, name: str, limit: int, *, lowest: int = 1) -> int:
    """``value`` as a whole number from ``lowest`` to ``limit``; a float without a fraction
    (``2.0``) is accepted, since JSON does not tell them apart. InputError says what to send
    otherwise."""
    send = f"send a whole number from {lowest} to {limit}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{name} must be a number, got {type(value).__name__} {value!r:.40}: {send}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{name} must be a finite number, got {value}: {send}")
    if value % 1:
        raise InputError(f"{name} must be a whole number, got {_shown(value)}: {send}")
    if value < lowest:
        raise InputError(f"{name} must be an integer ≥ {lowest}, got {_shown(value)}: {send}")
    if value > limit:
        raise InputError(f"{name} is {_shown(value)}, over the limit of {limit}: {send}")
    return int(value)


def _shown(number: int | float) -> str:
    if isinstance(number, float):
        return f"{number:g}"
    # str() of an int of thousands of digits raises, and would flood the message anyway.
    return str(number) if abs(number) < 10**15 else "a number of 16 digits or more"


def read_debate_id(payload: Mapping[str, Any]) -> str | None:
    value = payload.get("debateId")
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 256:
        raise InputError(f"payload.debateId must be a non-empty string of ≤ 256 characters, got {value!r}")
    return value


def read_replay(payload: Mapping[str, Any]) -> str | None:
    """``"replay": "rerun"`` asks for a fresh run under a new debate id instead of the stored result."""
    value = payload.get("replay")
    if value is None:
        return None
    if value != "rerun":
        raise InputError(f'payload.replay must be "rerun" (to run afresh), got {value!r}')
    return "rerun"


_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class ForkPoint:
    """Where a fork starts: the first ``from_round`` committed rounds of debate ``parent_id``."""

    parent_id: str
    from_round: int


def request_fingerprint(question: str, max_rounds: int | None, preset: str | None = None,
                        depth: int = 0, fork: ForkPoint | None = None) -> str:
    """What a request asks, hashed: everything a producer can set that changes the debate. The
    preset counts only when named, the sub-debate depth only above 0 and the fork point only for
    a fork, so requests without them keep their earlier fingerprints."""
    asked: dict[str, Any] = {"v": 1, "input": question, "maxRounds": max_rounds}
    if preset is not None:
        asked["preset"] = preset
    if depth:
        asked["depth"] = depth
    if fork is not None:
        asked["fork"] = [fork.parent_id, fork.from_round]
    return hashlib.sha256(_ENCODER.encode(asked)).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Ask:
    """One request's question: its input, round cap, debate id, which field named the id, the
    preset it asked for (None: the handler's own debate), its sub-debate depth (0: a top-level
    debate), its ``namespace``: the event type it was asked on, or the debate's name when
    called directly (see ``debate_key``), and, for a fork, where it forked from."""

    question: str
    max_rounds: int | None
    debate_id: str
    id_field: str  # "requestId" or "debateId"
    request_id: str | None
    fingerprint: str
    namespace: str
    preset: str | None = None
    depth: int = 0
    fork: ForkPoint | None = None

    @classmethod
    def of(cls, question: str, max_rounds: int | None, debate_id: str, id_field: str,
           request_id: str | None, namespace: str, preset: str | None = None,
           depth: int = 0, fork: ForkPoint | None = None) -> Ask:
        return cls(question, max_rounds, debate_id, id_field, request_id,
                   request_fingerprint(question, max_rounds, preset, depth, fork), namespace,
                   preset, depth, fork)

    @property
    def key(self) -> str:
        """Where its debate is kept in a store."""
        return debate_key(self.namespace, self.debate_id)

    def matches(self, fingerprint: str | None) -> bool:
        """Whether a stored record (its fingerprint) answers this question."""
        return fingerprint == self.fingerprint


def reused_id(ask: Ask) -> InputError:
    return InputError(
        f"{ask.id_field} {ask.debate_id!r} was already used for a debate with a different input "
        "(payload.input, maxRounds or preset differ), so its result is not this request's answer: send a "
        f"new requestId{' without debateId' if ask.id_field == 'debateId' else ''} for a new "
        'debate, or "replay": "rerun" to run this input afresh. A chain may keep its requestId '
        f"from hop to hop: each event type keeps its own debates (this one is on {ask.namespace!r})"
    )
