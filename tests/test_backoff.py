"""``full_jitter``: the one backoff rule, which ``Backoff``, ``RetryPolicy.delay`` and redis-py's
retries (through ``debatebus._redis``) all follow."""

from __future__ import annotations

import pytest

from debatebus._backoff import Backoff, full_jitter
from debatebus.llm._retry import RetryPolicy


def test_the_ceiling_doubles_up_to_the_cap_and_the_draw_scales_it() -> None:
    top = [full_jitter(n, 0.1, 1.0, lambda: 1.0) for n in range(6)]
    assert top == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert full_jitter(3, 0.1, 1.0, lambda: 0.25) == pytest.approx(0.2)
    assert full_jitter(10_000, 0.1, 1.0, lambda: 1.0) == 1.0  # no overflow however long it fails
    assert full_jitter(-1, 0.1, 1.0, lambda: 1.0) == pytest.approx(0.1)


def test_backoff_counts_its_tries_until_reset() -> None:
    backoff = Backoff(0.1, 0.4)
    waits = [backoff.next() for _ in range(5)]
    assert all(0.0 <= w <= c for w, c in zip(waits, [0.1, 0.2, 0.4, 0.4, 0.4], strict=True))
    assert backoff.attempt == 5
    backoff.reset()
    assert backoff.attempt == 0 and backoff.next() <= 0.1


def test_a_model_call_retry_waits_by_the_same_rule() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=3.0, jitter=lambda: 1.0)
    assert [policy.delay(n, None) for n in range(4)] == [
        full_jitter(n, 0.5, 3.0, lambda: 1.0) for n in range(4)] == pytest.approx([0.5, 1, 2, 3])
    assert policy.delay(5, 7.5) == 7.5  # the server's Retry-After wins
