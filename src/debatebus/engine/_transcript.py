"""Turns, rounds and the transcript they make: plain values, rendered for prompts on demand."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import msgspec

from debatebus._usage import ZERO_USAGE, TokenUsage


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


def _has_other_breaks(text: str) -> bool:
    """Whether ``text`` holds a line break other than "\n" that ``str.splitlines`` splits at.
    (Nine ``in`` tests, not one regex: 0.2 µs in a long turn, where the regex's scan took 3.)"""
    return ("\r" in text or "\v" in text or "\f" in text or "\x1c" in text or "\x1d" in text
            or "\x1e" in text or "\x85" in text or "\u2028" in text or "\u2029" in text)


# A turn is shown as reported speech with its text quoted line by line, not as ``[name]: text``
# script lines: small models continue a script by writing the next speaker's line themselves.
# (Every prompt renders the turns again: with "\n" breaks only, one replace quotes them all.)
def _render_turn(turn: Turn) -> str:
    text = turn.text.strip()
    if not text:
        return f"{turn.speaker} said nothing."
    if not _has_other_breaks(text):
        quoted = "> " + text.replace("\n", "\n> ")
    else:
        quoted = "\n".join([f"> {line}" for line in text.splitlines()])
    return f"{turn.speaker} said:\n{quoted}"


def _render_turns(turns: Iterable[Turn]) -> str:
    return "\n".join([_render_turn(t) for t in turns if not t.failed])


def render_round(rnd: Round) -> str:
    return render_turns(rnd.number, rnd.turns)


def render_turns(number: int, turns: Iterable[Turn]) -> str:
    """Round ``number`` as prompt text: a header, then each successful turn, quoted."""
    return f"Round {number}:\n{_render_turns(turns)}"


class TranscriptText(NamedTuple):
    """A transcript as prompt text, with ``breaks``: the offsets just after each turn, where the
    transcript an earlier call of the debate saw ends (for prompt caching)."""

    text: str
    breaks: tuple[int, ...] = ()


NO_TRANSCRIPT = TranscriptText("")


def render_transcript(rounds: Iterable[Round], number: int = 0,
                      current: Sequence[Turn] = ()) -> TranscriptText:
    """``rounds``, then round ``number``'s ``current`` turns (when there are any), as prompt text:
    the rounds' ``render_round`` texts joined by blank lines, with a break after every turn.
    (Plain loops: a debate renders its transcript for every call.)"""
    texts: list[str] = []
    breaks: list[int] = []
    at = -2  # where the text so far ends, less the blank line before the next round
    numbered: list[tuple[int, Sequence[Turn]]] = [(r.number, r.turns) for r in rounds]
    if current:
        numbered.append((number, current))
    for rnd_number, turns in numbered:
        shown = [_render_turn(t) for t in turns if not t.failed]
        head = f"Round {rnd_number}:\n"
        end = at + 1 + len(head)  # every turn but the first follows a line break
        for turn in shown:
            end += len(turn) + 1
            breaks.append(end)
        text = head + "\n".join(shown)
        texts.append(text)
        at += 2 + len(text)
    return TranscriptText("\n\n".join(texts), tuple(breaks))


def speaker_tags(name: str) -> tuple[str, ...]:
    """The ways a model writes ``name``'s turn when it impersonates it: stop sequences."""
    return (f"[{name}]", f"\n{name} said:", f"\n{name}:")


# A line that opens someone's turn: ``[anyone]``, ``name:``/``name said:`` for a known name, or a
# round header: where an impersonated or invented turn starts.
_ANY_TAG = r"\[[^\]\n]{1,40}\]"
_ROUND = r"\**round \d+\**\s*:?\**"


def _maybe_tagged(text: str) -> bool:
    """Whether ``text`` holds what every pattern below needs to match: ``[`` (a tag), ``:`` (a
    name), or a round header. (``in`` tests: 1 µs in a long turn, where a regex took 20.)"""
    return "[" in text or ":" in text or "round" in text.lower()


# The patterns depend only on the names, fixed for a whole debate: built once, not per turn.
@functools.lru_cache(maxsize=256)
def _turn_start(names: tuple[str, ...]) -> re.Pattern[str]:
    """A line opening another turn, searched for in "\n" + text: the line's "\n" starts the
    pattern (a line start, as ``^`` with MULTILINE), and a literal first character lets the
    search leap from one "\n" to the next instead of trying every position: 0.5 µs in a 1.4 KB
    turn, where ``^`` took 4.5. A match's start is its line's start in the text itself."""
    known = "|".join(re.escape(n) for n in names)
    named = rf"(?:{known})(?: said)?\s*:" if known else r"(?!)"
    return re.compile(rf"\n[ \t>*-]*(?:{_ANY_TAG}|{named}|{_ROUND})", re.IGNORECASE)


def clean_turn(text: str, speaker: str, names: Iterable[str]) -> str:
    """``text`` without a heading of its own (the speaker's tag, a round header, a ``[label]``)
    and cut where another turn starts (any ``[tag]``, another participant's name, a round
    header), with a dangling lead-in line such as "Here's a rewritten version of the debate:"
    dropped. Text with nothing to cut is kept as is."""
    if not _maybe_tagged(text):
        return text
    others = tuple(n for n in names if n != speaker)
    text = _strip_heading(text, speaker, others)
    cut = _turn_start(others).search("\n" + text)
    if cut is None:
        return text
    kept = text[: cut.start()].rstrip().splitlines()
    if kept and kept[-1].rstrip().endswith(":"):
        kept.pop()
    return "\n".join(kept).strip()


@functools.lru_cache(maxsize=256)
def _heading(speaker: str) -> re.Pattern[str]:
    return re.compile(
        rf"^[\s>*-]*(?:\[([^\]\n]{{1,40}})\]\s*:?|{re.escape(speaker)}(?: said)?\s*:|{_ROUND})\s*",
        re.IGNORECASE,
    )


def _strip_heading(text: str, speaker: str, others: tuple[str, ...]) -> str:
    """``text`` without the headings it opens with, unless one names another participant."""
    heading = _heading(speaker)
    lowered = {n.lower() for n in others}
    while (found := heading.match(text)) and found.end() > 0:
        if (found.group(1) or "").strip().lower() in lowered:
            return text
        text = text[found.end() :]
    return text


_SENTENCE_END = re.compile(r"[.!?](?=[\"')\]]?(?:\s|$))")


def fit_words(text: str, limit: int | None) -> str:
    """``text`` cut to at most ``limit`` words, at the last sentence end when there is one in the
    second half (a model stopped by its token budget ends mid-sentence)."""
    if not limit or len(text.split()) <= limit:
        return text
    head = text[: _end_of_word(text, limit)]
    ends = [m.end() for m in _SENTENCE_END.finditer(head)]
    if ends and len(head[: ends[-1]].split()) * 2 >= limit:
        return head[: ends[-1]]
    return head.rstrip(",;:- ") + "…"


def _end_of_word(text: str, n: int) -> int:
    """The index just after the ``n``-th whitespace-separated word of ``text``."""
    return [m.end() for m in re.finditer(r"\S+", text)][n - 1]


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
