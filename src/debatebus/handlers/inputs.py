"""Validation of what producers send: every problem becomes an InputError that says what to fix."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from debatebus.exceptions import InputError

__all__ = [
    "DEFAULT_MAX_INPUT_BYTES",
    "MAX_DEPTH_LIMIT",
    "MAX_ROUNDS_LIMIT",
    "read_debate_id",
    "read_depth",
    "read_max_rounds",
    "read_question",
    "read_replay",
]

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
