"""Checkpoint stores for durable debates, chosen by URL with ``store_from_url``, or from the
broker's URL with ``store_for_broker`` (the default a bus gives a durable handler).

``RedisCheckpointStore`` is imported lazily, so ``redis`` stays an optional dependency.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from debatebus._redaction import redact
from debatebus._retention import DEFAULT_RETENTION_S, take_retention
from debatebus.checkpoints._base import CheckpointStore, Counters, Lease, StoredCheckpoint
from debatebus.checkpoints._memory import MemoryCheckpointStore
from debatebus.checkpoints._sqlite import SQLiteCheckpointStore
from debatebus.exceptions import ConfigError
from debatebus.transports import redis_server_url

if TYPE_CHECKING:
    from debatebus.checkpoints._redis import RedisCheckpointStore

__all__ = [
    "DEFAULT_RETENTION_S",
    "CheckpointStore",
    "Counters",
    "Lease",
    "MemoryCheckpointStore",
    "RedisCheckpointStore",
    "SQLiteCheckpointStore",
    "StoredCheckpoint",
    "store_for_broker",
    "store_from_url",
]

FORMS = ("memory://", "sqlite:///abs/path.db", "sqlite://relative/path.db",
         "a file path ending .db, .sqlite or .sqlite3", "redis://host:port/db",
         "rediss://host:port/db")
_SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def __getattr__(name: str) -> Any:
    if name == "RedisCheckpointStore":
        from debatebus.checkpoints._redis import RedisCheckpointStore

        return RedisCheckpointStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def store_from_url(url: str, **options: Any) -> CheckpointStore:
    """``memory://`` → in-process; ``sqlite:///abs/path.db`` (or ``sqlite://rel/path.db``, or a
    plain path ending .db/.sqlite/.sqlite3) → SQLite; ``redis://``/``rediss://`` → Redis.
    A ``retention=`` query parameter (``7d``, ``12h``, ``3600``, ``never``) sets ``retention_s``.
    ``options`` go to the store's constructor (``retention_s``, ``prefix``…)."""
    url, retention = take_retention(url, "retention")
    if retention is not None:
        options.setdefault("retention_s", retention)
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return MemoryCheckpointStore(**options)
    if scheme == "sqlite":
        return SQLiteCheckpointStore(_sqlite_path(url), **options)
    if scheme in ("redis", "rediss"):
        from debatebus.checkpoints._redis import RedisCheckpointStore

        return RedisCheckpointStore(url, **options)
    if "://" not in url and Path(url).suffix.lower() in _SQLITE_SUFFIXES:
        return SQLiteCheckpointStore(url, **options)
    raise ConfigError(f"unsupported checkpoint store URL {redact(url)!r}: use one of {', '.join(FORMS)}")


def store_for_broker(url: str) -> CheckpointStore | None:
    """The default store for a bus on ``url``: Redis (Streams or pub/sub) → a Redis store on the
    same server and db, with the same query options; ``memory://`` → a memory store; Kafka →
    None (no shared store can be guessed from a Kafka URL)."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return MemoryCheckpointStore()
    server = redis_server_url(url)
    if server is not None:
        from debatebus.checkpoints._redis import RedisCheckpointStore

        return RedisCheckpointStore(server)
    if scheme == "kafka":
        return None
    # The scheme only: the rest of a broker URL may hold a password.
    raise ConfigError(f"no default checkpoint store for a broker URL of scheme {scheme!r}: pass "
                      "store= to as_handler()")


def _sqlite_path(url: str) -> str:
    # Everything after "sqlite://": three slashes give an absolute path, two a relative one.
    path = url.split("://", 1)[1].split("?", 1)[0]
    if not path:
        raise ConfigError(f"checkpoint store URL {redact(url)!r} names no file: use e.g. {FORMS[1]}")
    return path
