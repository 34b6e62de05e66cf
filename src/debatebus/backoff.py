"""Capped exponential backoff with full jitter, for riding out broker and store outages."""

from __future__ import annotations

import random

__all__ = ["Backoff"]


class Backoff:
    """The n-th wait is uniform in [0, min(cap_s, base_s × 2ⁿ)]: clients that failed together
    spread out instead of returning in lockstep. ``reset()`` after a success."""

    def __init__(self, base_s: float = 0.1, cap_s: float = 5.0) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0

    def next(self) -> float:
        ceiling = min(self.cap_s, self.base_s * 2 ** min(self.attempt, 16))
        self.attempt += 1
        return random.uniform(0, ceiling)

    def reset(self) -> None:
        self.attempt = 0
