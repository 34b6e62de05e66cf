"""Choosing a checkpoint store by URL."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from debatebus.checkpoints import (
    MemoryCheckpointStore,
    RedisCheckpointStore,
    SQLiteCheckpointStore,
    store_from_url,
)
from debatebus.exceptions import ConfigError


def test_memory() -> None:
    assert isinstance(store_from_url("memory://"), MemoryCheckpointStore)


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///var/lib/debatebus/ckpt.db", "/var/lib/debatebus/ckpt.db"),
        ("sqlite://relative/ckpt.db", "relative/ckpt.db"),
        ("sqlite://:memory:", ":memory:"),
        ("ckpt.db", "ckpt.db"),
        ("/tmp/debates.sqlite", "/tmp/debates.sqlite"),
        ("data/debates.sqlite3", "data/debates.sqlite3"),
    ],
)
def test_sqlite(url: str, path: str) -> None:
    store = store_from_url(url, retention_s=60)
    assert isinstance(store, SQLiteCheckpointStore)
    assert store.path == path
    assert store.retention_s == 60


@pytest.mark.parametrize(
    ("query", "seconds"),
    [("retention=7d", 7 * 86400), ("retention=12h", 43200), ("retention=30m", 1800),
     ("retention=90s", 90), ("retention=3600", 3600), ("retention=0.5", 0.5),
     ("retention=never", math.inf), ("", 7 * 86400)],
)
@pytest.mark.parametrize("base", ["memory://", "sqlite:///tmp/ckpt.db", "redis://h:6390/0"])
def test_retention_from_the_url(base: str, query: str, seconds: float) -> None:
    store = store_from_url(f"{base}?{query}" if query else base)
    assert store.retention_s == seconds


@pytest.mark.redis
async def test_retention_is_taken_out_of_the_redis_url(redis_url: str) -> None:
    # redis-py refuses a query parameter it does not know: the store must not pass it on.
    async with store_from_url(f"{redis_url}&retention=1d", prefix="url-test") as store:
        assert store.retention_s == 86400
        await store.put_result("d1", b"r")
        assert await store.get_result("d1") == b"r"


def test_an_explicit_retention_wins_over_the_url() -> None:
    assert store_from_url("memory://?retention=1d", retention_s=5).retention_s == 5


@pytest.mark.parametrize("value", ["", "0", "-1d", "soon", "7w", "nan", "inf"])
def test_bad_retention_in_the_url(value: str) -> None:
    with pytest.raises(ConfigError, match="retention="):
        store_from_url(f"memory://?retention={value}")


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "rediss://user:pw@host:6380/2"])
def test_redis(url: str) -> None:
    store = store_from_url(url, prefix="app")
    assert isinstance(store, RedisCheckpointStore)
    assert store.prefix == "app"


@pytest.mark.parametrize("url", ["kafka://localhost:9092", "postgres://x/y", "ckpt.json", "",
                                 "sqlite://"])
def test_unsupported_urls_list_the_forms(url: str) -> None:
    with pytest.raises(ConfigError, match=r"memory://|sqlite:///"):
        store_from_url(url)


def test_redis_stays_an_optional_import() -> None:
    # sys.modules["redis"] = None makes "import redis" fail, as if it were not installed.
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "import debatebus.checkpoints as c\n"
        "assert c.store_from_url('memory://') is not None\n"
        "try:\n    c.RedisCheckpointStore\nexcept ImportError:\n    pass\n"
        "else:\n    raise AssertionError('RedisCheckpointStore imported without redis')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent)


async def test_memory_roundtrip_via_url() -> None:
    async with store_from_url("memory://") as store:
        assert await store.begin("d1", b"h") == b"h"
