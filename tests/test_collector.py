"""Python's cyclic GC while a worker serves: applied after start-up, restored after; or left alone."""

from __future__ import annotations

import asyncio
import gc

import pytest

from debatebus.client import BusClient
from debatebus.collector import DEFAULT_THRESHOLDS, Collector
from debatebus.exceptions import ConfigError
from debatebus.transports.memory import MemoryBroker, MemoryTransport
from debatebus.worker import DebateBus
from tests.bus.conftest import make_debate, running


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


async def test_a_worker_serves_with_the_default_collector_and_restores_it() -> None:
    before = gc.get_threshold()
    broker = MemoryBroker()
    app = DebateBus(MemoryTransport(broker))
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
