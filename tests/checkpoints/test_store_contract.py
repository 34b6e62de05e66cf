"""The checkpoint store contract: memory, SQLite and Redis must all pass this suite."""

from __future__ import annotations

import asyncio
import os

import pytest
from tests.support.checkpoints import Backend

from debatebus.checkpoints import CheckpointStore, Counters
from debatebus.exceptions import ConfigError

TTL = 0.4  # lease TTL for expiry tests
EXPIRED = 1.2  # comfortably past TTL, even on a loaded 2-core machine
LONG = 60.0  # a lease that must not expire during a test


def usage(n: int) -> Counters:
    return Counters(prompt_tokens=10 * n, completion_tokens=5 * n, total_tokens=15 * n, calls=n)


async def wait_lease_gone(store: CheckpointStore, debate_id: str) -> None:
    """Wait past TTL, then until the store agrees the lease lapsed (Redis expiry is lazy+active)."""
    await asyncio.sleep(EXPIRED)
    for _ in range(50):
        if await store.get_lease(debate_id) is None:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"lease on {debate_id} still live long after its TTL")


# ---- checkpoints ------------------------------------------------------------------------------


async def test_unknown_debate_has_nothing(store: CheckpointStore) -> None:
    assert await store.load("nope") is None
    assert await store.get_result("nope") is None
    assert await store.get_lease("nope") is None
    assert await store.size_bytes("nope") == 0
    assert await store.has_results(["nope"]) == [False]


async def test_begin_is_idempotent_and_keeps_the_first_header(store: CheckpointStore) -> None:
    assert await store.begin("d1", b"first") == b"first"
    assert await store.begin("d1", b"second") == b"first"
    loaded = await store.load("d1")
    assert loaded is not None
    assert loaded.header == b"first"
    assert loaded.entries == []
    assert loaded.counters == Counters()


async def test_append_keeps_order_and_the_last_counters(store: CheckpointStore) -> None:
    await store.begin("d1", b"h")
    counts = [await store.append("d1", f"round {i}".encode(), usage(i)) for i in range(1, 6)]
    assert counts == [1, 2, 3, 4, 5]
    loaded = await store.load("d1")
    assert loaded is not None
    assert loaded.entries == [f"round {i}".encode() for i in range(1, 6)]
    assert loaded.counters == usage(5)


async def test_values_are_opaque_bytes(store: CheckpointStore) -> None:
    header, entries = b"\x00\xff{h}\r\n", [b"", b"\x00", os.urandom(3000), "é".encode()]
    await store.begin("bin", header)
    for entry in entries:
        await store.append("bin", entry, Counters())
    loaded = await store.load("bin")
    assert loaded is not None
    assert loaded.header == header
    assert loaded.entries == entries
    result = os.urandom(500) + b"\x00"
    await store.put_result("bin", result)
    assert await store.get_result("bin") == result


async def test_loaded_entries_are_a_snapshot(store: CheckpointStore) -> None:
    await store.begin("d1", b"h")
    await store.append("d1", b"e1", usage(1))
    first = await store.load("d1")
    assert first is not None
    first.entries.append(b"mutated by the caller")
    await store.append("d1", b"e2", usage(2))
    again = await store.load("d1")
    assert again is not None
    assert again.entries == [b"e1", b"e2"]


async def test_append_before_begin_is_refused(store: CheckpointStore) -> None:
    with pytest.raises(ConfigError, match="begin"):
        await store.append("never-begun", b"e", usage(1))
    assert await store.load("never-begun") is None


async def test_debates_are_independent(store: CheckpointStore) -> None:
    await store.begin("a", b"ha")
    await store.begin("b", b"hb")
    await store.append("a", b"a1", usage(1))
    await store.append("b", b"b1", usage(7))
    await store.append("a", b"a2", usage(2))
    a, b = await store.load("a"), await store.load("b")
    assert a is not None
    assert b is not None
    assert (a.header, a.entries, a.counters) == (b"ha", [b"a1", b"a2"], usage(2))
    assert (b.header, b.entries, b.counters) == (b"hb", [b"b1"], usage(7))


async def test_concurrent_appends_are_atomic(store: CheckpointStore, peer: CheckpointStore) -> None:
    await store.begin("d1", b"h")
    bodies = [f"e{i}".encode() for i in range(40)]
    counts = await asyncio.gather(
        *(s.append("d1", body, usage(1)) for s, body in zip([store, peer] * 20, bodies, strict=True))
    )
    assert sorted(counts) == list(range(1, 41))
    loaded = await store.load("d1")
    assert loaded is not None
    assert sorted(loaded.entries) == sorted(bodies)


async def test_a_second_worker_sees_the_checkpoint(backend: Backend, store: CheckpointStore) -> None:
    await store.begin("d1", b"h")
    await store.append("d1", b"e1", usage(1))
    await store.close()
    other = backend.make()
    async with other:
        assert await other.begin("d1", b"other header") == b"h"
        assert await other.append("d1", b"e2", usage(2)) == 2
        loaded = await other.load("d1")
    assert loaded is not None
    assert loaded.entries == [b"e1", b"e2"]


async def test_size_grows_linearly_with_entries(store: CheckpointStore) -> None:
    await store.begin("d1", b"header " * 20)
    entry, sizes, n = os.urandom(1000), {}, 0
    for target in (2, 4, 8, 16):
        while n < target:
            n = await store.append("d1", entry, usage(n + 1))
        sizes[target] = await store.size_bytes("d1")
    early, late = sizes[8] - sizes[4], sizes[16] - sizes[8]
    assert early > 0, sizes
    # Linear: 8 more entries cost twice what 4 more did. Quadratic storage would cost 4x.
    assert late == pytest.approx(2 * early, rel=0.10), sizes
    assert late / 8 >= len(entry), sizes  # every entry is actually kept


# ---- results ----------------------------------------------------------------------------------


async def test_put_result_drops_the_checkpoint(store: CheckpointStore) -> None:
    await store.begin("d1", b"h")
    await store.append("d1", b"e1", usage(1))
    await store.put_result("d1", b"result")
    assert await store.get_result("d1") == b"result"
    assert await store.load("d1") is None
    assert await store.size_bytes("d1") == 0
    with pytest.raises(ConfigError):
        await store.append("d1", b"late entry from a stale worker", usage(2))
    assert await store.load("d1") is None


async def test_put_result_overwrites(store: CheckpointStore) -> None:
    await store.put_result("d1", b"first")
    await store.put_result("d1", b"second")
    assert await store.get_result("d1") == b"second"


async def test_put_result_without_a_checkpoint(store: CheckpointStore) -> None:
    await store.put_result("d1", b"r")
    assert await store.get_result("d1") == b"r"
    assert await store.load("d1") is None


async def test_has_results_answers_a_batch_in_order(store: CheckpointStore) -> None:
    await store.put_result("b", b"rb")
    await store.put_result("d", b"rd")
    await store.begin("c", b"begun, not finished")
    ids = ["a", "b", "c", "d", "b", "e"]
    assert await store.has_results(ids) == [False, True, False, True, True, False]
    assert await store.has_results([]) == []
    many = [f"id-{i}" for i in range(1200)]  # past any per-statement parameter limit
    await store.put_result("id-1100", b"r")
    assert (await store.has_results(many)).count(True) == 1


# ---- leases -----------------------------------------------------------------------------------


async def test_lease_free_then_held(store: CheckpointStore, peer: CheckpointStore) -> None:
    assert await store.acquire_lease("d1", "w1", LONG) is True
    assert await peer.acquire_lease("d1", "w2", LONG) is False
    lease = await peer.get_lease("d1")
    assert lease is not None
    assert lease.owner == "w1"
    assert 0 < lease.expires_in_s <= LONG


async def test_same_owner_reacquires_and_extends(store: CheckpointStore) -> None:
    assert await store.acquire_lease("d1", "w1", TTL) is True
    assert await store.acquire_lease("d1", "w1", LONG) is True
    lease = await store.get_lease("d1")
    assert lease is not None
    assert lease.owner == "w1"
    assert lease.expires_in_s > LONG / 2


async def test_renew_extends_our_lease(store: CheckpointStore, peer: CheckpointStore) -> None:
    assert await store.acquire_lease("d1", "w1", TTL) is True
    assert await store.renew_lease("d1", "w1", LONG) is True
    await asyncio.sleep(EXPIRED)  # past the first TTL: only the renewal keeps it alive
    assert await peer.acquire_lease("d1", "w2", LONG) is False
    lease = await store.get_lease("d1")
    assert lease is not None
    assert lease.owner == "w1"
    assert lease.expires_in_s > LONG / 2


async def test_expired_lease_goes_to_another_owner(store: CheckpointStore,
                                                   peer: CheckpointStore) -> None:
    assert await store.acquire_lease("d1", "w1", TTL) is True
    await wait_lease_gone(peer, "d1")
    assert await peer.acquire_lease("d1", "w2", LONG) is True
    assert await store.renew_lease("d1", "w1", LONG) is False
    lease = await store.get_lease("d1")
    assert lease is not None
    assert lease.owner == "w2"


async def test_expired_lease_is_not_renewed_even_if_untaken(store: CheckpointStore) -> None:
    # The owner must notice that its lease lapsed: another worker may have resumed meanwhile.
    assert await store.acquire_lease("d1", "w1", TTL) is True
    await wait_lease_gone(store, "d1")
    assert await store.renew_lease("d1", "w1", LONG) is False
    assert await store.get_lease("d1") is None


async def test_renew_of_someone_elses_lease_fails(store: CheckpointStore,
                                                  peer: CheckpointStore) -> None:
    assert await store.renew_lease("d1", "w1", LONG) is False  # nobody holds it
    assert await store.acquire_lease("d1", "w1", LONG) is True
    assert await peer.renew_lease("d1", "w2", LONG) is False
    lease = await store.get_lease("d1")
    assert lease is not None
    assert lease.owner == "w1"


async def test_release_only_by_the_owner(store: CheckpointStore, peer: CheckpointStore) -> None:
    assert await store.acquire_lease("d1", "w1", LONG) is True
    await peer.release_lease("d1", "w2")  # not ours: a no-op
    lease = await store.get_lease("d1")
    assert lease is not None
    assert lease.owner == "w1"
    await store.release_lease("d1", "w1")
    assert await store.get_lease("d1") is None
    assert await peer.acquire_lease("d1", "w2", LONG) is True
    await store.release_lease("d1", "w1")  # released already, and now someone else's
    lease = await store.get_lease("d1")
    assert lease is not None
    assert lease.owner == "w2"


async def test_leases_are_per_debate(store: CheckpointStore) -> None:
    assert await store.acquire_lease("d1", "w1", LONG) is True
    assert await store.acquire_lease("d2", "w2", LONG) is True
    assert await store.get_lease("d3") is None


async def test_concurrent_acquires_have_one_winner(store: CheckpointStore,
                                                   peer: CheckpointStore) -> None:
    won = await asyncio.gather(
        *(s.acquire_lease("d1", f"w{i}", LONG) for i, s in enumerate([store, peer] * 5))
    )
    assert won.count(True) == 1


@pytest.mark.parametrize("ttl", [0, -1.0, float("nan")])
async def test_nonsense_ttls_are_refused(store: CheckpointStore, ttl: float) -> None:
    with pytest.raises(ConfigError, match="ttl"):
        await store.acquire_lease("d1", "w1", ttl)
    with pytest.raises(ConfigError, match="ttl"):
        await store.renew_lease("d1", "w1", ttl)


# ---- composite steps (start / append_many / finish) -------------------------------------------


async def test_start_on_a_fresh_debate_takes_the_lease_and_writes_the_header(
        store: CheckpointStore, peer: CheckpointStore) -> None:
    opening = await store.start("s1", "me", LONG, b"header-1")
    assert opening.acquired and opening.result is None
    assert opening.header == b"header-1"
    assert opening.checkpoint is not None and opening.checkpoint.entries == []
    other = await peer.start("s1", "you", LONG, b"header-2")
    assert not other.acquired and other.result is None
    assert other.lease is not None and other.lease.owner == "me"


async def test_start_by_another_run_of_the_same_worker_finds_the_lease_held(
        store: CheckpointStore) -> None:
    # Every run leases under its own owner ("worker/run-a", "worker/run-b"): owners compare whole,
    # so a worker's second copy of a request waits for its first instead of running it again.
    first = await store.start("s4", "worker/run-a", LONG, b"h")
    second = await store.start("s4", "worker/run-b", LONG, b"h")
    assert first.acquired and not second.acquired
    assert second.lease is not None and second.lease.owner == "worker/run-a"


async def test_start_returns_what_is_committed_and_keeps_the_first_header(
        store: CheckpointStore) -> None:
    await store.start("s2", "me", TTL, b"first")
    await store.append_many("s2", [b"framing", b"round-1"], usage(4))
    await wait_lease_gone(store, "s2")
    opening = await store.start("s2", "next", LONG, b"second")
    assert opening.acquired
    assert opening.header == b"first"
    assert opening.checkpoint is not None
    assert opening.checkpoint.entries == [b"framing", b"round-1"]
    assert opening.checkpoint.counters == usage(4)


async def test_finish_stores_the_result_drops_the_checkpoint_and_frees_the_lease(
        store: CheckpointStore, peer: CheckpointStore) -> None:
    await store.start("s3", "me", LONG, b"h")
    await store.append_many("s3", [b"r1"], usage(3))
    await store.finish("s3", "me", b"result")
    assert await store.get_result("s3") == b"result"
    assert await store.load("s3") is None
    assert await store.get_lease("s3") is None
    opening = await peer.start("s3", "you", LONG, b"h")
    assert opening.result == b"result"


async def test_append_many_before_start_is_refused(store: CheckpointStore) -> None:
    with pytest.raises(ConfigError):
        await store.append_many("never-started", [b"x"], usage(1))


# ---- retention --------------------------------------------------------------------------------

# A sleep only ever runs late: being past a time after one is certain, while what must still be
# kept needs slack for a stalled machine (about a second in these tests).
KEEP = 1.2  # retention for expiry tests
PAST_KEEP = 1.3  # past KEEP, 1.1 s short of the finished marker (kept 2 * KEEP)
# For a checkpoint written twice: each of two steps stays 1 s inside KEEP_TWICE, together past it.
KEEP_TWICE = 2.2
STEP = 1.2


async def test_checkpoints_expire_retention_after_their_last_write(store: CheckpointStore) -> None:
    # The store keeps 7 days; the calls ask for KEEP_TWICE (as a handler's retention_s does).
    await store.start("k1", "me", LONG, b"h", retention_s=KEEP_TWICE)
    await asyncio.sleep(STEP)
    # The append starts the retention again.
    await store.append_many("k1", [b"r1"], usage(1), retention_s=KEEP_TWICE)
    await asyncio.sleep(STEP)  # past KEEP_TWICE since start, not since the append
    loaded = await store.load("k1")
    assert loaded is not None and loaded.entries == [b"r1"]
    await asyncio.sleep(STEP)  # past KEEP_TWICE since the append too
    assert await store.load("k1") is None
    assert await store.size_bytes("k1") == 0
    with pytest.raises(ConfigError, match="before begin"):
        await store.append("k1", b"r2", usage(2))
    assert await store.begin("k1", b"h2") == b"h2"  # an expired checkpoint is not resumed
    loaded = await store.load("k1")
    assert loaded is not None and loaded.entries == []


async def test_results_expire_and_a_rerun_knows_it(backend: Backend) -> None:
    async with backend.retained(KEEP) as store:
        assert store.retention_s == KEEP
        await store.put_result("y", b"other")
        await store.start("x", "me", LONG, b"h")
        await store.finish("x", "me", b"result")
        assert await store.get_result("x") == b"result"
        assert await store.result_expired("x") is False
        await asyncio.sleep(PAST_KEEP)
        assert await store.get_result("x") is None
        assert await store.has_results(["x", "y"]) == [False, False]
        assert await store.result_expired("x") is True
        assert await store.result_expired("never") is False
        opening = await store.start("x", "me-again", LONG, b"h")
        assert opening.acquired and opening.result is None and opening.expired
        assert opening.checkpoint is not None and opening.checkpoint.entries == []
        await store.finish("x", "me-again", b"result-2")
        assert await store.get_result("x") == b"result-2"
        assert await store.result_expired("x") is False
        await asyncio.sleep(2 * KEEP + 0.3 - PAST_KEEP)  # past the marker of "y"
        assert await store.result_expired("y") is False


async def test_a_fresh_start_is_not_marked_expired(store: CheckpointStore) -> None:
    opening = await store.start("fresh", "me", LONG, b"h")
    assert opening.acquired and not opening.expired


@pytest.mark.parametrize("retention", [0, -1.0, float("nan")])
async def test_nonsense_retention_is_refused(backend: Backend, store: CheckpointStore,
                                             retention: float) -> None:
    with pytest.raises(ConfigError, match="retention_s"):
        backend.retained(retention)
    with pytest.raises(ConfigError, match="retention_s"):
        await store.put_result("d1", b"r", retention_s=retention)
    with pytest.raises(ConfigError, match="retention_s"):
        await store.start("d1", "me", LONG, b"h", retention_s=retention)
