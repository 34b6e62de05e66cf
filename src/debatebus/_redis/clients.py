"""The redis-py clients debatebus builds or is given: one server (``Redis``) or a Redis Cluster
(``RedisCluster``, ``?cluster=true``), with bytes replies and hiredis's command packer; the check
a Redis component makes when it connects; and ``describe``, where a client points, for messages.

Timeouts: clients are built without a per-read socket timeout (redis-py would arm one for every
reply of a pipeline); each call is bounded as a whole instead, by ``redis_call`` or, for what
goes through a batcher, by the batcher's per-pipeline timer (the transports'
``command_timeout``, the checkpoint store's ``timeout_s``).
"""

from __future__ import annotations

from typing import Any, TypeAlias, TypeGuard, cast
from urllib.parse import urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import (
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import AbstractBackoff
from redis.exceptions import DataError

from debatebus._backoff import full_jitter
from debatebus._redaction import redact
from debatebus._redis.connection import pack_command
from debatebus._redis.urls import split_cluster, split_seeds
from debatebus._retention import TOPIC_RETENTION_PARAM, take_retention
from debatebus.exceptions import ConfigError

#: The client seam: one Redis server, or a Redis Cluster (``?cluster=true`` in the URL).
RedisClient: TypeAlias = Redis | RedisCluster
#: redis-py's waits between its own retries of a failed connection: short, so an unreachable
#: broker fails in about a second.
_RETRY_BASE_S, _RETRY_CAP_S = 0.05, 0.5


class _Jitter(AbstractBackoff):
    """debatebus's backoff (``full_jitter``) in the shape redis-py's ``Retry`` takes."""

    def compute(self, failures: int) -> float:
        return full_jitter(failures, _RETRY_BASE_S, _RETRY_CAP_S)

    def reset(self) -> None:
        """Nothing to reset: the wait depends on the count of failures alone."""


class _HiredisPacking:
    """Packs commands with hiredis's C packer, as the batcher does: redis-py's asyncio
    connections use a pure-Python packer that costs ~3× more per command, which shows on a bus
    doing thousands per second."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str) and " " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [pack_command(args)]
        except TypeError as exc:
            raise DataError(str(exc)) from exc


class _FastConnection(_HiredisPacking, Connection):
    pass


class _FastSSLConnection(_HiredisPacking, SSLConnection):
    pass


class _FastUnixConnection(_HiredisPacking, UnixDomainSocketConnection):
    pass


_FAST = {Connection: _FastConnection, SSLConnection: _FastSSLConnection,
         UnixDomainSocketConnection: _FastUnixConnection}


def _use_hiredis_packing(client: Redis) -> None:
    pool = client.connection_pool
    fast = _FAST.get(pool.connection_class)
    if fast is not None:
        pool.connection_class = fast


def is_cluster(client: RedisClient | None) -> TypeGuard[RedisCluster]:
    """Whether ``client`` talks to a Redis Cluster: the one place the client seam is told apart."""
    return isinstance(client, RedisCluster)


def build_client(url: str, *, connect_timeout: float) -> RedisClient:
    """A client for ``url`` with bytes replies (bodies are never decoded) and short retries, so an
    unreachable broker fails in about a second, not after redis-py's default backoff (~7 s).
    ``?cluster=true``: a ``RedisCluster`` seeded from the URL's hosts (it finds the other nodes).
    A ``topic_retention`` parameter (the Streams transport's) is left out: the bus's URL builds
    the default checkpoint store's and ``debatebus check``'s clients too."""
    plain, cluster = split_cluster(take_retention(url, TOPIC_RETENTION_PARAM)[0])
    plain, seeds = split_seeds(plain)
    if len(seeds) > 1 and not cluster:
        raise ConfigError(f"invalid Redis URL {redact(url)!r}: several hosts name the seeds of a "
                          "Redis Cluster: add ?cluster=true, or keep one host")
    options: dict[str, Any] = dict(
        decode_responses=False, socket_connect_timeout=connect_timeout, socket_timeout=None,
        socket_keepalive=True,
        retry=Retry(_Jitter(), retries=2))
    try:
        if cluster:
            return RedisCluster.from_url(
                plain, startup_nodes=[ClusterNode(host, port) for host, port in seeds], **options)
        client = Redis.from_url(plain, **options)
    except (ValueError, redis_errors.RedisClusterException) as e:
        raise ConfigError(f"invalid Redis URL {redact(url)!r}: {e}") from e
    _use_hiredis_packing(client)
    return client


def check_client(client: RedisClient) -> None:
    """A caller-supplied client must hand back bytes: bodies are opaque and never decoded."""
    if client.get_encoder().decode_responses:
        raise ConfigError("pass a redis.asyncio.Redis or RedisCluster built with "
                          "decode_responses=False")


def url_or_given(url_or_client: str | RedisClient) -> tuple[str | None, RedisClient | None]:
    """What a Redis-backed component was given: a URL (it builds and closes its own client), or
    the caller's client (checked here; the caller keeps owning it)."""
    if isinstance(url_or_client, str):
        return url_or_client, None
    check_client(url_or_client)
    return None, url_or_client


def describe(url: str | None, client: RedisClient | None = None) -> str:
    """``host:port`` for messages (a cluster URL's seeds, comma-separated), never the password in
    the URL."""
    if is_cluster(client):
        nodes = client.get_nodes()
        return f"{nodes[0].name if nodes else 'seed node'} (cluster)"
    if client is not None:
        kwargs = cast(Redis, client).connection_pool.connection_kwargs
        if "path" in kwargs:
            return str(kwargs["path"])
        return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    plain, cluster = split_cluster(url or "")
    first, seeds = split_seeds(plain)
    parts = urlsplit(first)
    if parts.scheme == "unix":
        return parts.path
    where = ",".join(f"{host}:{port}" for host, port in seeds) or "localhost:6379"
    return f"{where} (cluster)" if cluster else where
