"""Numeric request fields: every wrong value is an InputError that says what to send."""

from __future__ import annotations

from typing import Any

import pytest
from tests.support.bus import make_debate

from debatebus.exceptions import InputError
from debatebus.handlers._inputs import MAX_ROUNDS_LIMIT, read_max_rounds

SEND = f"send a whole number from 1 to {MAX_ROUNDS_LIMIT}"


@pytest.mark.parametrize(("value", "says"), [
    (float("inf"), "must be a finite number, got inf"),  # what JSON's 1e400 decodes to
    (float("-inf"), "must be a finite number, got -inf"),
    (float("nan"), "must be a finite number, got nan"),
    (-1, "must be an integer ≥ 1, got -1"),
    (0, "must be an integer ≥ 1, got 0"),
    (0.0, "must be an integer ≥ 1, got 0"),
    (True, "must be a number, got bool True"),
    (False, "must be a number, got bool False"),
    (2.5, "must be a whole number, got 2.5"),
    ("2", "must be a number, got str '2'"),
    ([2], "must be a number, got list [2]"),
    ({"n": 2}, "must be a number, got dict"),
    (MAX_ROUNDS_LIMIT + 1, f"is {MAX_ROUNDS_LIMIT + 1}, over the limit of {MAX_ROUNDS_LIMIT}"),
    (1e300, "is 1e+300, over the limit"),
    (10**5000, "is a number of 16 digits or more, over the limit"),  # str() would raise
    (-(10**5000), "must be an integer ≥ 1, got a number of 16 digits or more"),
], ids=lambda value: type(value).__name__ if isinstance(value, int) else None)
def test_bad_max_rounds_say_what_to_send(value: Any, says: str) -> None:
    with pytest.raises(InputError) as info:
        read_max_rounds({"maxRounds": value}, cap=3)
    message = str(info.value)
    assert message.startswith("payload.maxRounds ")
    assert says in message
    assert message.endswith(SEND)


@pytest.mark.parametrize(("value", "rounds"), [
    (None, None), (1, 1), (2, 2), (2.0, 2), (3, 3), (99, 3), (MAX_ROUNDS_LIMIT, 3),
])
def test_good_max_rounds_never_exceed_the_debates_cap(value: Any, rounds: int | None) -> None:
    assert read_max_rounds({"maxRounds": value}, cap=3) == rounds
    assert read_max_rounds({}, cap=3) is None


async def test_a_handler_refuses_an_infinite_max_rounds_as_bad_input() -> None:
    handler = make_debate().as_handler()
    with pytest.raises(InputError, match=r"payload\.maxRounds must be a finite number"):
        await handler({"input": "t", "maxRounds": float("inf")})
