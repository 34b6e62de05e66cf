"""Retention through the durable handler: an expired result runs again, and says so."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from tests.support.durable import CountingLLM, debate, needed_calls
from tests.support.servers import RedisServer

from debatebus.checkpoints import MemoryCheckpointStore, SQLiteCheckpointStore
from debatebus.checkpoints._base import CheckpointStore
from debatebus.exceptions import ConfigError

#: The retention these tests ask for. They wait ``WAIT`` after the result is stored: certainly past
#: the retention (a sleep only ever runs late), and about three seconds short of the finished
#: marker (kept twice the retention), so a stall of up to three seconds on a loaded machine fails
#: neither the replay just after the first run nor the expired re-run after the wait.
RETENTION = 3.0
WAIT = RETENTION + 0.1


async def _expired_result_runs_again(store: CheckpointStore,
                                     handler_retention: float | None) -> None:
    llm = CountingLLM()
    handler = debate(llm, rounds=2).as_handler(store=store, retention_s=handler_retention)
    first = await handler({"input": "t"}, request_id="d1")
    assert first["debateReplayed"] is False and "debateResultExpired" not in first
    replayed = await handler({"input": "t"}, request_id="d1")
    assert replayed["debateReplayed"] is True and len(llm.calls) == needed_calls(2)
    await asyncio.sleep(WAIT)
    again = await handler({"input": "t"}, request_id="d1")
    assert again["debateStatus"] == "completed"
    assert again["debateReplayed"] is False
    assert again["debateResultExpired"] is True
    assert len(llm.calls) == 2 * needed_calls(2)  # every call paid again
    stored = await handler({"input": "t"}, request_id="d1")  # the re-run's result is stored
    assert stored["debateReplayed"] is True and stored["debateResultExpired"] is True
    assert len(llm.calls) == 2 * needed_calls(2)


async def test_the_stores_retention() -> None:
    await _expired_result_runs_again(MemoryCheckpointStore(retention_s=RETENTION), None)


async def test_the_handlers_retention_overrides_the_stores(tmp_path: Path) -> None:
    async with SQLiteCheckpointStore(tmp_path / "r.db") as store:  # keeps 7 days itself
        await _expired_result_runs_again(store, RETENTION)


@pytest.mark.redis
async def test_on_redis(redis_server: RedisServer) -> None:
    from debatebus.checkpoints import RedisCheckpointStore

    prefix = f"test-{uuid.uuid4().hex[:12]}"
    async with RedisCheckpointStore(redis_server.url, prefix=prefix,
                                    retention_s=RETENTION) as store:
        await _expired_result_runs_again(store, None)


@pytest.mark.parametrize("retention", [0, -5.0, float("nan")])
def test_a_nonsense_handler_retention_is_refused(retention: float) -> None:
    with pytest.raises(ConfigError, match="retention_s"):
        debate(CountingLLM()).as_handler(store=MemoryCheckpointStore(), retention_s=retention)
