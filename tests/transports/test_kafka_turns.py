"""A Kafka member hands a fetched batch out in bursts, letting the event loop go between them,
so aiokafka's producer task writes results while the rest of the batch is handled."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition
from tests.support.loop import LoopTurns

from debatebus.transports.kafka import KafkaTransport
from debatebus.transports.kafka._group import HANDOUT_BURST, Member


async def _no_recheck(names: Any) -> None:
    return None


async def _no_mark(tp: TopicPartition, offset: int) -> None:
    return None


def _member_with(records: int) -> Member:
    settings = KafkaTransport("127.0.0.1:1").settings  # no connection until used
    member = Member(SimpleNamespace(), {"t": "debate:t"}, "g", prefetch=records * 2,
                    settings=settings, recheck=_no_recheck, mark_at=_no_mark)
    tp = TopicPartition("t", 0)
    for offset in range(records):
        member._take(tp, SimpleNamespace(topic="t", partition=0, offset=offset, timestamp=0,
                                         key=b"k", value=b"{}", headers=()))
    return member


async def _turns_taken_by_others(member: Member, count: int) -> tuple[list[str], int]:
    """Hand out ``count`` deliveries; the ids handed out, and how many turns another task (as
    aiokafka's sender, which runs whenever the loop gets a turn) had meanwhile."""
    async with LoopTurns() as turns:
        handed = [await member.next() for _ in range(count)]
    return [d.id for d in handed if d is not None], turns.count


async def test_a_buffered_batch_is_handed_out_with_turns_for_the_loop_in_between() -> None:
    ids, turns = await _turns_taken_by_others(_member_with(3 * HANDOUT_BURST), 3 * HANDOUT_BURST)
    assert ids == [f"0:{n}" for n in range(3 * HANDOUT_BURST)]
    assert turns == 3  # every burst ends with one; handing out from the buffer never waits


async def test_a_burst_is_handed_out_without_giving_the_loop_a_turn() -> None:
    ids, turns = await _turns_taken_by_others(_member_with(HANDOUT_BURST - 1), HANDOUT_BURST - 1)
    assert len(ids) == HANDOUT_BURST - 1
    assert turns == 0
