"""Choosing a checkpoint store by URL."""

from __future__ import annotations

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
    store = store_from_url(url, result_ttl_s=60)
    assert isinstance(store, SQLiteCheckpointStore)
    assert store.path == path


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
