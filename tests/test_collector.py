"""Python's cyclic GC while a worker serves: applied after start-up, restored after; or left alone."""

from __future__ import annotations

import asyncio
import collections
import gc
import uuid

import pytest

from debatebus._collector import DEFAULT_COLLECTOR, DEFAULT_THRESHOLDS, Collector
from debatebus._worker import DebateBus
from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.client import BusClient
from debatebus.exceptions import ConfigError
from debatebus.transports._memory import MemoryBroker, MemoryTransport
from tests.support.bus import make_debate, running


def test_serving_applies_thresholds_and_freezes_then_restores_both() -> None:
    before = gc.get_threshold()
    with Collector(thresholds=(1234, 5, 6)).serving():
        assert gc.get_threshold() == (1234, 5, 6)
        assert gc.get_freeze_count() > 0  # what existed at start-up
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_pythons_collector_is_left_alone_when_asked() -> None:
    before = gc.get_threshold()
    with Collector(freeze=False, thresholds=None).serving():
        assert gc.get_threshold() == before
        assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


@pytest.mark.parametrize("thresholds", [(700, -1, 10), (700, 10)])
def test_thresholds_are_gc_set_thresholds_three_counts(thresholds: tuple[int, ...]) -> None:
    with pytest.raises(ConfigError, match="three counts"):
        Collector(thresholds=thresholds)  # type: ignore[arg-type]


async def test_a_worker_leaves_the_collector_alone_unless_given_one() -> None:
    """The collector is the process's: an app that embeds a worker keeps its settings."""
    before = gc.get_threshold()
    app = DebateBus(MemoryTransport(MemoryBroker()))
    app.subscribe("debate:request", make_debate().as_handler(durable=False))
    async with running(app):
        await asyncio.sleep(0.05)  # connected: now serving
        assert gc.get_threshold() == before
        assert gc.get_freeze_count() == 0


def test_nested_serving_keeps_the_first_setting_until_the_last_ends() -> None:
    before = gc.get_threshold()
    with Collector().serving():
        frozen = gc.get_freeze_count()
        with Collector(thresholds=(1000, 10, 10)).serving():
            assert gc.get_threshold() == DEFAULT_THRESHOLDS
        # Still frozen (unfreezing empties it; frozen objects that die meanwhile leave it).
        assert frozen > 0 and gc.get_freeze_count() > frozen // 2, \
            "the inner block unfroze the outer one"
        assert gc.get_threshold() == DEFAULT_THRESHOLDS
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


async def test_a_worker_serves_with_the_default_collector_and_restores_it() -> None:
    before = gc.get_threshold()
    broker = MemoryBroker()
    app = DebateBus(MemoryTransport(broker), collector=DEFAULT_COLLECTOR)
    app.subscribe("debate:request", make_debate().as_handler(durable=False))
    async with running(app):
        await asyncio.sleep(0.05)  # connected: now serving
        assert gc.get_threshold() == DEFAULT_THRESHOLDS
        assert gc.get_freeze_count() > 0
        async with BusClient(MemoryTransport(broker)) as client:
            result = await client.request("debate:request", {"input": "Tabs or spaces?"},
                                          timeout=30)
        assert result.payload["debateStatus"] == "completed"
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


async def _cycles_left(client: BusClient, topic: str, debates: int) -> collections.Counter[str]:
    """What ``debates`` requests answered through a worker left as reference cycles (unreachable
    objects only the cyclic collector would free), by type: all automatic collection off."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept in gc.garbage to look at
    try:
        results = await asyncio.gather(*(
            client.request(topic, {"input": f"Tabs or spaces? {n}"}, timeout=30)
            for n in range(debates)))
        assert [r.payload["debateStatus"] for r in results] == ["completed"] * debates
        gc.collect()
        return collections.Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()


@pytest.mark.parametrize("broker", ["memory", "redis"])
async def test_debates_leave_no_reference_cycles(broker: str, request: pytest.FixtureRequest) -> None:
    """The default collector's thresholds rest on this: a durable debate answered on the bus
    (engine, handler, checkpoint store, settler, transport) is freed by reference counting."""
    topic = f"debate:cycles{uuid.uuid4().hex[:6]}"
    if broker == "redis":
        url = request.getfixturevalue("redis_server").url
        app, client = DebateBus(url), BusClient(url)
        handler = make_debate().as_handler()  # checkpoints in the broker's Redis
    else:
        memory = MemoryBroker()
        app, client = DebateBus(MemoryTransport(memory)), BusClient(MemoryTransport(memory))
        handler = make_debate().as_handler(store=MemoryCheckpointStore())
    app.subscribe(topic, handler)
    async with running(app), client:
        await _cycles_left(client, topic, 20)  # connections opened and scripts loaded once
        assert await _cycles_left(client, topic, 20) == {}
