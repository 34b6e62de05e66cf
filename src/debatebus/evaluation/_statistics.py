"""The statistics of an evaluation, as functions of values: an accuracy's 95% interval (Wilson),
paired tests of two arms over the same items (exact McNemar, paired bootstrap) and percentiles."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist

#: The level of every interval an evaluation reports.
CONFIDENCE = 0.95
_Z = NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)  # 1.959963984540054


@dataclass(frozen=True, slots=True)
class Interval:
    low: float
    high: float


def wilson_interval(correct: int, n: int) -> Interval:
    """The 95% Wilson score interval of ``correct`` out of ``n`` (0..1; the whole range at n=0).
    Unlike p ± 1.96·SE it stays within 0..1 and is not zero-wide at 0 or n correct."""
    if not 0 <= correct <= n:
        raise ValueError(f"correct must be from 0 to n={n}, got {correct}")
    if n == 0:
        return Interval(0.0, 1.0)
    p = correct / n
    z2 = _Z * _Z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = _Z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return Interval(max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_exact(wins: int, losses: int) -> float:
    """The two-sided exact McNemar p-value of two arms over the same items: ``wins`` items only
    the first got right, ``losses`` only the second (the items both got right or wrong say
    nothing). Under "neither is better" each discordant item is a fair coin: p is twice the
    binomial tail of the rarer outcome, at most 1; 1 when no item is discordant."""
    if wins < 0 or losses < 0:
        raise ValueError(f"counts must be ≥ 0, got {wins} and {losses}")
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**n)))


def paired_bootstrap(first: Sequence[bool], second: Sequence[bool], *, resamples: int,
                     seed: int) -> Interval:
    """The 95% percentile interval of ``accuracy(first) - accuracy(second)`` over ``resamples``
    resamples of the items (the same items for both arms, drawn with ``seed``)."""
    n = len(first)
    if n != len(second):
        raise ValueError(f"paired samples must be as long: {n} and {len(second)}")
    if n == 0 or resamples < 1:
        raise ValueError("a bootstrap needs at least one item and one resample")
    diffs = [int(a) - int(b) for a, b in zip(first, second, strict=True)]
    draw = random.Random(seed)
    means = sorted(sum(draw.choices(diffs, k=n)) / n for _ in range(resamples))
    tail = (1 - CONFIDENCE) / 2
    return Interval(percentile(means, tail), percentile(means, 1 - tail))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, interpolated linearly between the closest ranks."""
    if not values:
        raise ValueError("no values to take a percentile of")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)
