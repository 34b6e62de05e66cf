"""Pure decisions of a debate: budgets, stop conditions, survivors, output and scores, as
functions of values."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from debatebus._usage import ZERO_USAGE, TokenUsage
from debatebus.engine._definition import Budget, DebateSpec
from debatebus.engine._phi import compute_phi_hat
from debatebus.engine._result import DebateState, StopReason
from debatebus.engine._transcript import Round, Turn
from debatebus.exceptions import BudgetExceededError, LLMResponseError
from debatebus.llm._base import LLMRequest
from debatebus.llm._structured import InvalidStructuredOutput, parse_structured
from debatebus.schemas.cost import DebateCost

if TYPE_CHECKING:
    from debatebus.engine._subdebates import SubDebateRecord


class DebateFailure(Exception):
    """Ends a run with status ``failed``; the message becomes the result's ``error``.

    ``final``: running the debate again cannot end otherwise (a budget reached). Any other
    failure (a provider's error, a key or setting that is wrong, a timeout, a malformed answer)
    may pass: its result is published but not stored as the debate's answer, so a resend or a
    replay runs it again from its last committed round. ``stop_reason``: the budget limit or
    spend limit that stopped it, if one did."""

    def __init__(self, message: str, *, final: bool = False,
                 stop_reason: StopReason | None = None) -> None:
        super().__init__(message)
        self.final = final
        self.stop_reason = stop_reason


def check_budget(budget: Budget, calls: int, usage: TokenUsage, request: LLMRequest,
                 cost: float = 0.0) -> None:
    """Raise BudgetExceededError when ``calls``/``usage``/``cost`` (spent so far) leave no room
    for ``request``."""
    before = f"before {request.purpose} by {request.speaker!r} in round {request.round}"
    if budget.max_calls is not None and calls >= budget.max_calls:
        raise BudgetExceededError(
            f"budget max_calls={budget.max_calls} reached: {calls} calls made {before}",
            limit="max_calls")
    limit = budget.max_total_tokens
    if limit is not None and usage.total_tokens >= limit:
        raise BudgetExceededError(
            f"budget max_total_tokens={limit} reached: {usage.total_tokens} tokens spent {before}",
            limit="max_total_tokens")
    if budget.max_cost is not None and cost >= budget.max_cost:
        raise BudgetExceededError(
            f"budget max_cost={budget.max_cost:g} reached: {cost:.6g} spent {before}",
            limit="max_cost")


def spent_cost(spec: DebateSpec, by_speaker: Mapping[str, TokenUsage]) -> float:
    """What the calls in ``by_speaker`` cost at ``spec.prices`` (which price every model the debate
    calls when its budget has ``max_cost``: checked at construction)."""
    prices = spec.prices
    if prices is None:
        return 0.0
    return math.fsum(prices.cost(spec.models.get(who, ""), usage) or 0.0
                     for who, usage in by_speaker.items())


def debate_cost(spec: DebateSpec, by_speaker: Mapping[str, TokenUsage],
                children: Sequence[SubDebateRecord]) -> DebateCost | None:
    """What a debate cost, by speaker, with its children; None unless every call that spent
    something is priced (its model is in ``spec.prices``, a child's cost is known, in the same
    currency): never an estimate."""
    prices = spec.prices
    if prices is None:
        return None
    participants: dict[str, float] = {}
    for who, usage in by_speaker.items():
        if usage == ZERO_USAGE:
            continue
        cost = prices.cost(spec.models.get(who, ""), usage)
        if cost is None:
            return None
        participants[who] = cost
    spent_by_children = []
    for record in children:
        if record.cost is None and record.usage == ZERO_USAGE:
            continue  # it spent nothing: nothing to price
        if record.cost is None or record.cost.currency != prices.currency:
            return None
        spent_by_children.append(record.cost.total)
    return prices.debate_cost(participants, math.fsum(spent_by_children))


def require_a_survivor(turns: Sequence[Turn], number: int, phase: str) -> None:
    """A round where every participant failed fails the debate."""
    if turns and all(t.failed for t in turns):
        raise DebateFailure(
            f"every participant failed in round {number} ({phase}); first error: "
            f"{turns[0].error}"
        )


def stop_reached(
    spec: DebateSpec, rounds: Sequence[Round], state: Callable[[], DebateState]
) -> bool:
    """``until`` when given (the state is only built then), else the judge's consensus on the
    latest verdict; never without either, and never before ``min_rounds`` rounds were played."""
    if not rounds or rounds[-1].number < spec.min_rounds:
        return False
    if spec.until is not None:
        return bool(spec.until(state()))
    return spec.judge is not None and consensus_reached(latest_verdict(rounds))


def consensus_reached(verdict: BaseModel | None) -> bool:
    """The verdict's ``consensus`` flag, unless its summary says nothing (``empty_verdict``)."""
    return (verdict is not None and getattr(verdict, "consensus", False) is True
            and not empty_verdict(verdict))


def empty_verdict(verdict: BaseModel) -> bool:
    """A verdict whose ``summary`` is empty or only repeats its schema's own text (its title,
    description or field names, which the judge model was shown): a small model that copied them
    ruled nothing. A schema without a string ``summary`` is never empty."""
    summary = getattr(verdict, "summary", None)
    if not isinstance(summary, str):
        return False
    said = _plain(summary)
    return not said or said in _schema_texts(type(verdict))


def _plain(text: str) -> str:
    """``text`` compared loosely: case, spacing, quotes and end punctuation ignored."""
    return " ".join(re.sub(r"[\"'`‘’“”.!?:;,*_()\[\]{}-]+", " ", text).split()).casefold()


@functools.lru_cache(maxsize=64)
def _schema_texts(schema: type[BaseModel]) -> frozenset[str]:
    """The texts of ``schema``'s JSON schema (titles, descriptions, property names), as the
    judge model was shown them, compared loosely."""
    return frozenset(_plain(text) for text in _texts_in(schema.model_json_schema()))


def _texts_in(node: Any) -> Iterator[str]:
    if isinstance(node, list):
        for item in node:
            yield from _texts_in(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in ("title", "description") and isinstance(value, str):
                yield value
            elif key == "properties" and isinstance(value, dict):
                yield from value
            yield from _texts_in(value)


def latest_verdict(rounds: Sequence[Round]) -> BaseModel | None:
    return next((r.verdict for r in reversed(rounds) if r.verdict is not None), None)


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


def parse_verdict(schema: type[BaseModel], text: str, model: str) -> BaseModel:
    """Validate a judge's text answer when the model gave no structured object."""
    try:
        return parse_structured(text, schema)
    except InvalidStructuredOutput as exc:
        raise LLMResponseError(
            f"judge model {model!r} did not return a valid {schema.__name__}: {text[:200]!r}"
        ) from exc
