"""Records land on the partitions the Java client puts them on: Kafka's murmur2, checked against
the Java client's own test vectors, aiokafka's implementation and a real broker."""

from __future__ import annotations

import random
import uuid

import pytest
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from tests.support.servers import TansuServer

from debatebus.transports import transport_from_url
from debatebus.transports._base import Outgoing
from debatebus.transports.kafka._partitioner import murmur2, partition

#: ``UtilsTest.testMurmur2`` of the Java client: key → murmur2 as a signed 32-bit int.
JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def _java_partition(key: bytes, count: int) -> int:
    return (JAVA_VECTORS[key] & 0x7FFFFFFF) % count


@pytest.mark.parametrize("key", list(JAVA_VECTORS))
def test_murmur2_matches_the_java_client(key: bytes) -> None:
    assert murmur2(key) == JAVA_VECTORS[key] & 0xFFFFFFFF


def test_murmur2_matches_aiokafka_for_every_tail_length() -> None:
    rng = random.Random(7)
    for length in range(70):
        for _ in range(20):
            data = rng.randbytes(length)
            assert murmur2(data) == aiokafka_murmur2(data), data


def test_partition_by_key_single_partition_and_no_key() -> None:
    for key in JAVA_VECTORS:
        assert partition(key, [0, 1, 2, 3, 4, 5], [0, 1]) == _java_partition(key, 6)
    assert partition(b"21", [4], [4]) == 4
    assert {partition(None, [0, 1, 2], [2]) for _ in range(20)} == {2}
    assert {partition(None, [0, 1, 2], []) for _ in range(200)} == {0, 1, 2}


@pytest.mark.kafka
async def test_a_keyed_record_lands_where_the_java_client_puts_it(tansu_server: TansuServer) -> None:
    event_type = f"debate:keys{uuid.uuid4().hex[:6]}"
    async with transport_from_url(f"{tansu_server.url}?partitions=6") as transport:
        await transport.ensure_topics([event_type])
        for key in JAVA_VECTORS:
            where = await transport.publish(Outgoing(event_type, b"{}", key=key.decode()))
            assert int(where.split(":")[0]) == _java_partition(key, 6), key
