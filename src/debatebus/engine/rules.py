"""Pure decisions of a debate: stop conditions, survivors, output and scores, as functions of values."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from debatebus.engine.definition import DebateSpec, Participant
from debatebus.engine.phi import compute_phi_hat
from debatebus.engine.prompts import word_limit_text
from debatebus.engine.result import DebateState
from debatebus.engine.transcript import Round, Turn
from debatebus.exceptions import LLMResponseError

__all__ = [
    "consensus_reached",
    "first_and_last_texts",
    "latest_verdict",
    "output_of",
    "parse_verdict",
    "round_robin_phi",
    "stop_reached",
    "utility_text",
    "word_limit_text",
]


def stop_reached(
    spec: DebateSpec, rounds: Sequence[Round], state: Callable[[], DebateState]
) -> bool:
    """``until`` when given (the state is only built then), else the judge's consensus flag on
    the latest verdict; never without either."""
    if spec.until is not None:
        return bool(spec.until(state()))
    return spec.judge is not None and consensus_reached(latest_verdict(rounds))


def consensus_reached(verdict: object) -> bool:
    return getattr(verdict, "consensus", False) is True


def latest_verdict(rounds: Sequence[Round]) -> Any:
    return next((r.verdict for r in reversed(rounds) if r.verdict is not None), None)


def utility_text(participant: Participant) -> str:
    u = participant.utility
    return f" You maximize: {u.maximizes}. You penalize: {u.penalizes}." if u else ""


def first_and_last_texts(rounds: Sequence[Round]) -> tuple[dict[str, str], dict[str, str]]:
    """Each speaker's first and last successful texts across the rounds."""
    first: dict[str, str] = {}
    last: dict[str, str] = {}
    for rnd in rounds:
        for turn in rnd.turns:
            if not turn.failed:
                first.setdefault(turn.speaker, turn.text)
                last[turn.speaker] = turn.text
    return first, last


def round_robin_phi(rounds: Sequence[Round]) -> float | None:
    """Φ̂ between each participant's first and last turns; None with fewer than two rounds."""
    if len(rounds) < 2:
        return None
    first, last = first_and_last_texts(rounds)
    return compute_phi_hat(first, last)


def lines_of(turns: Sequence[Turn]) -> str:
    return "\n".join(f"{t.speaker}: {t.text}" for t in turns if not t.failed)


def output_of(synthesis: Turn | None, rounds: Sequence[Round], sole: str | None = None) -> str:
    """The synthesis when there is one, else a sole survivor's text, else the last round's lines."""
    if synthesis is not None:
        return synthesis.text
    if sole is not None:
        return sole
    return lines_of(rounds[-1].turns) if rounds else ""


_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def parse_verdict(schema: type[BaseModel], text: str, model: str) -> BaseModel:
    """Validate a judge's text answer when the model gave no structured object."""
    match = _JSON_OBJECT.search(text)
    try:
        data: Any = json.loads(match.group(0)) if match else None
        return schema.model_validate(data)
    except (ValueError, ValidationError) as exc:
        raise LLMResponseError(
            f"judge model {model!r} did not return a valid {schema.__name__}: {text[:200]!r}"
        ) from exc
