"""``SlotReads``, the per-slot blocking reads of a ``consume`` over several hash slots: nothing a
read got is dropped, whether another read fails or the consume ends (no server needed)."""

from __future__ import annotations

import asyncio

import pytest

from debatebus.exceptions import TransportError
from debatebus.transports._redis_reads import SlotReads


async def _answer(value: list[str], after: float = 0.0) -> list[str]:
    await asyncio.sleep(after)
    return value


async def test_a_failed_read_does_not_drop_what_another_read_got() -> None:
    go = asyncio.Event()
    runs: list[str] = []

    async def answering() -> list[str]:
        runs.append("answering")
        await go.wait()
        return ["a1", "a2"]

    async def failing() -> list[str]:
        runs.append("failing")
        await go.wait()
        raise TransportError("UNBLOCKED the stream key no longer exists")

    reads = SlotReads([answering, failing])
    first = asyncio.ensure_future(reads.next())
    await asyncio.sleep(0.01)
    go.set()  # both reads end in the same round
    with pytest.raises(TransportError, match="UNBLOCKED"):
        await first  # the error at once (the caller recovers, or ends and calls stop)...
    assert await reads.next() == ["a1", "a2"]  # ...then what the other read got, kept for it
    assert runs == ["answering", "failing"]  # handed out without reading again
    with pytest.raises(TransportError, match="UNBLOCKED"):
        await reads.next()
    assert runs.count("failing") == 2  # the read that failed runs again
    assert reads.stop() == ["a1", "a2"]  # what was kept for after the error, never handed out


async def test_stop_hands_back_what_finished_reads_got_and_cancels_the_rest() -> None:
    slow = asyncio.Event()

    async def blocked() -> list[str]:
        await slow.wait()
        return ["never"]

    reads = SlotReads([lambda: _answer(["first"]), blocked, lambda: _answer(["late"], 0.05)])
    assert await reads.next() == ["first"]
    await asyncio.sleep(0.1)  # the third read answers while nobody asks
    assert reads.stop() == ["late"]
    await asyncio.sleep(0)
    slow.set()
    assert reads.stop() == []  # the blocked read was cancelled, not left running
