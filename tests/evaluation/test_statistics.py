"""The statistics against values worked out by hand."""

from __future__ import annotations

import pytest

from debatebus.evaluation._statistics import (
    mcnemar_exact,
    paired_bootstrap,
    percentile,
    wilson_interval,
)


@pytest.mark.parametrize(("correct", "n", "low", "high"), [
    # p ± z·sqrt(p(1-p)/n + z²/4n²), both over 1 + z²/n, centred on (p + z²/2n)/(1 + z²/n).
    (7, 10, 0.3968, 0.8922),
    (3, 10, 0.1078, 0.6032),
    (0, 10, 0.0, 0.2775),
    (10, 10, 0.7225, 1.0),
    (50, 100, 0.4038, 0.5962),
    (1, 1, 0.2065, 1.0),
])
def test_wilson_interval(correct: int, n: int, low: float, high: float) -> None:
    interval = wilson_interval(correct, n)
    assert interval.low == pytest.approx(low, abs=5e-5)
    assert interval.high == pytest.approx(high, abs=5e-5)


def test_wilson_interval_of_nothing_is_everything_and_bad_counts_are_refused() -> None:
    assert wilson_interval(0, 0) == wilson_interval(0, 0).__class__(0.0, 1.0)
    with pytest.raises(ValueError, match="correct must be from 0 to n=3"):
        wilson_interval(4, 3)


@pytest.mark.parametrize(("wins", "losses", "p"), [
    (7, 0, 2 / 2**7),                # 0.015625
    (1, 6, 2 * (1 + 7) / 2**7),      # 0.125
    (2, 0, 0.5),
    (0, 5, 2 / 2**5),                # 0.0625
    (5, 5, 1.0),                     # the tail is over half: capped at 1
    (3, 5, 2 * (1 + 8 + 28 + 56) / 2**8),  # 0.7265625
    (0, 0, 1.0),
])
def test_exact_mcnemar(wins: int, losses: int, p: float) -> None:
    assert mcnemar_exact(wins, losses) == pytest.approx(p, rel=1e-12)
    assert mcnemar_exact(losses, wins) == pytest.approx(p, rel=1e-12)  # two-sided


def test_exact_mcnemar_stays_exact_past_float_range() -> None:
    # 0.5**1500 underflows to 0; the exact sum does not. The normal approximation with
    # continuity correction, z = (|800 - 700| - 1) / sqrt(1500) = 2.556, gives p = 0.0106.
    assert mcnemar_exact(700, 800) == pytest.approx(0.0106, abs=3e-4)


def test_paired_bootstrap_is_seeded_and_brackets_the_difference() -> None:
    first = [i % 3 != 0 for i in range(200)]  # 133 right
    second = [i % 2 == 0 for i in range(200)]  # 100 right
    interval = paired_bootstrap(first, second, resamples=2000, seed=1)
    assert interval == paired_bootstrap(first, second, resamples=2000, seed=1)
    # Another seed draws other resamples (with few of them, other bounds).
    assert paired_bootstrap(first, second, resamples=5, seed=1) != paired_bootstrap(
        first, second, resamples=5, seed=2)
    assert interval.low < 33 / 200 < interval.high
    assert 0 < interval.low < interval.high < 0.35
    same = paired_bootstrap(first, first, resamples=100, seed=1)
    assert (same.low, same.high) == (0.0, 0.0)


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0.5) == 2.5
    assert percentile(values, 0.0) == 1.0
    assert percentile(values, 1.0) == 4.0
    assert percentile(values, 0.95) == pytest.approx(3.85)
    assert percentile([7.0], 0.95) == 7.0
