"""Capped exponential backoff with full jitter: the one rule for every wait before trying again
(broker and store outages, the settler, model calls, redis-py's reconnects)."""

from __future__ import annotations

import random
from collections.abc import Callable

#: The waits between tries at a broker that fails (the settler's retries, the worker's
#: reconnects): 0.1 s at first, twice as long each time, at most 5 s.
BROKER_BASE_S = 0.1
BROKER_CAP_S = 5.0


def full_jitter(attempt: int, base_s: float, cap_s: float,
                draw: Callable[[], float] = random.random) -> float:
    """The wait after ``attempt`` earlier tries (0: the first): uniform in
    [0, min(cap_s, base_s × 2ⁿ)] (``draw``: a number in [0, 1)), so clients that failed together
    spread out instead of coming back in lockstep."""
    return draw() * _ceiling(attempt, base_s, cap_s)


class Backoff:
    """``full_jitter`` with its count of tries: ``next()`` is the next wait, ``reset()`` after a
    success."""

    def __init__(self, base_s: float = 0.1, cap_s: float = 5.0) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0

    def next(self) -> float:
        wait = full_jitter(self.attempt, self.base_s, self.cap_s)
        self.attempt += 1
        return wait

    def reset(self) -> None:
        self.attempt = 0


def redelivery_delay(deliveries: int, base_s: float = 0.5, cap_s: float = 30.0) -> float:
    """How long a message handed back after its ``deliveries``-th delivery waits before it is
    handed out again, where the transport decides (Redis pub/sub keeps the copy itself): uniform
    in [c/2, c] for c = min(cap_s, base_s × 2ⁿ⁻¹), so a request that meets a passing fault (a
    second of Redis trouble) reaches its delivery limit only after seconds, not at once."""
    ceiling = _ceiling(deliveries - 1, base_s, cap_s)
    return random.uniform(ceiling / 2, ceiling)


def _ceiling(attempt: int, base_s: float, cap_s: float) -> float:
    """The longest wait after ``attempt`` earlier ones (0: the first): base_s × 2ⁿ, capped."""
    return min(cap_s, base_s * float(2 ** min(max(attempt, 0), 16)))
