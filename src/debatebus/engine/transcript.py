"""Turns, rounds and the transcript they make: plain values, rendered for prompts on demand."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from debatebus.schemas.usage import ZERO_USAGE, TokenUsage

__all__ = ["Round", "Transcript", "Turn"]


class Turn(msgspec.Struct, kw_only=True, gc=False):
    """One participant's contribution to one round. A failed turn keeps the error text."""

    speaker: str
    round: int
    text: str
    usage: TokenUsage = ZERO_USAGE
    failed: bool = False
    error: str | None = None


class Round(msgspec.Struct, kw_only=True):
    """A round's turns in speaking order, the judge's verdict (a pydantic model) and its usage.

    ``phase`` names the kind of round: ``opening``/``rebuttal`` in round-robin,
    ``audience``/``position``/``revision`` in cross-pollination.
    """

    number: int
    turns: list[Turn]
    verdict: Any = None
    phase: str = ""
    usage: TokenUsage = ZERO_USAGE

    def texts(self) -> dict[str, str]:
        """Successful turns' texts by speaker."""
        return {t.speaker: t.text for t in self.turns if not t.failed}


def _render_turns(turns: Iterable[Turn]) -> str:
    return "\n".join(f"[{t.speaker}]: {t.text}" for t in turns if not t.failed)


def render_round(rnd: Round) -> str:
    return render_turns(rnd.number, rnd.turns)


def render_turns(number: int, turns: Iterable[Turn]) -> str:
    """Round ``number`` as prompt text: a header, then each successful turn on its own line."""
    return f"Round {number}:\n{_render_turns(turns)}"


class Transcript:
    """Read-only view over a debate's rounds, plus the turns of the round in progress."""

    __slots__ = ("_current", "_rounds")

    def __init__(self, rounds: Sequence[Round], current: Sequence[Turn] = ()) -> None:
        self._rounds = rounds
        self._current = current

    @property
    def rounds(self) -> Sequence[Round]:
        return self._rounds

    def render(self, last_rounds: int | None = None) -> str:
        """The transcript as prompt text; ``last_rounds`` keeps only the most recent N rounds."""
        rounds = self._rounds if last_rounds is None else self._rounds[-last_rounds:]
        parts = [render_round(r) for r in rounds]
        if self._current:
            parts.append(render_turns(self._current[0].round, self._current))
        return "\n\n".join(parts)

    def by_speaker(self, name: str) -> list[Turn]:
        turns = [t for r in self._rounds for t in r.turns if t.speaker == name]
        return turns + [t for t in self._current if t.speaker == name]

    def round(self, n: int) -> Round:
        for rnd in self._rounds:
            if rnd.number == n:
                return rnd
        raise KeyError(
            f"no round {n} in this transcript (rounds: {[r.number for r in self._rounds]})"
        )

    def __len__(self) -> int:
        return len(self._rounds)

    def __str__(self) -> str:
        return self.render()
