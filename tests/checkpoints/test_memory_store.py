"""Memory-only behaviour: what expired is swept out, not only hidden."""

from __future__ import annotations

import asyncio

from debatebus.checkpoints import Counters, MemoryCheckpointStore


async def test_purge_drops_expired_checkpoints_and_result_bodies() -> None:
    # Retention 1.1 s, marker 2.2 s: each check has about a second of slack on a stalled machine
    # (the sleeps only ever run late, so being past a time is certain).
    store = MemoryCheckpointStore(retention_s=1.1)
    await store.begin("c1", b"h")
    await store.append("c1", b"e1", Counters(calls=1))
    await store.put_result("r1", b"r" * 1000)
    await store.begin("kept", b"h", retention_s=60)
    assert store.purge_expired() == 0
    await asyncio.sleep(1.2)  # past the retention, not past the marker (kept 2.2 s)
    assert store.purge_expired() == 2  # checkpoint c1 and the body of r1
    assert store.purge_expired() == 0  # the marker of r1 stays, bodiless
    assert await store.result_expired("r1") is True
    await asyncio.sleep(1.1)  # 2.3 s in all: past the marker
    assert await store.result_expired("r1") is False
    assert await store.begin("kept", b"other") == b"h"
