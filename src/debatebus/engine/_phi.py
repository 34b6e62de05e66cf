"""Φ̂, the integration score: how much participants' word sets moved between two of their texts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

# Runs of word characters; letters are most of them, and tokenize() splits off the rest (digits,
# "_", numerics such as "²"). Faster than matching a letters-only class directly.
_WORD = re.compile(r"\w{3,}")
#: For ASCII text as bytes: each letter lowered (which is casefolding, for ASCII), the rest spaces.
_ASCII_LETTERS = bytes(c | 0x20 if chr(c).isascii() and chr(c).isalpha() else 0x20
                       for c in range(256))


def tokenize(text: str) -> set[str]:
    """Case-folded words of three or more Unicode letters."""
    if text.isascii():  # bytes.translate and split: half the time of a regex's findall
        words = set(text.encode("ascii").translate(_ASCII_LETTERS).decode("ascii").split())
        return {w for w in words if len(w) >= 3}
    words = set(_WORD.findall(text.casefold()))
    if "".join(words).isalpha():  # the common case: every run is letters only
        return words
    return {w for run in words for w in _letter_runs(run) if len(w) >= 3}


def _letter_runs(run: str) -> list[str]:
    return "".join(ch if ch.isalpha() else " " for ch in run).split()


def _jaccard_distance(a: set[str], b: set[str]) -> float:
    union = a | b
    if not union:
        return 0.0
    return 1.0 - len(a & b) / len(union)


def compute_phi_hat(before: Mapping[str, str], after: Mapping[str, str]) -> float:
    """Mean Jaccard distance over participants present on both sides (0.0 when there are none)."""
    names = [name for name in before if name in after]
    if not names:
        return 0.0
    total = sum(_jaccard_distance(tokenize(before[n]), tokenize(after[n])) for n in names)
    return total / len(names)


def interpret_phi_hat(
    phi: float, high: float = 0.70, medium: float = 0.50
) -> Literal["low", "medium", "high"]:
    if phi >= high:
        return "high"
    if phi >= medium:
        return "medium"
    return "low"
