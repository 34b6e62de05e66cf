"""What the Redis transports and the Redis checkpoint store share: the client builder, the
redis→debatebus error mapping and the command packer (the batcher is in ``redis_pipeline``).

Timeouts: clients are built without a per-read socket timeout (redis-py would arm one for every
reply of a pipeline); each call is bounded as a whole instead, by ``redis_call`` or, for what
goes through a ``CommandBatcher``, by the batcher's per-pipeline timer (the transports'
``command_timeout``, the checkpoint store's ``timeout_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import ssl
from collections.abc import (
    AsyncIterator,
    Iterable,
    Iterator,
    Mapping,
)
from types import MappingProxyType
from typing import Any, TypeAlias, TypeGuard, cast
from urllib.parse import urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import (
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import DataError

from debatebus.exceptions import ConfigError, TransportError
from debatebus.redaction import redact
from debatebus.retention import TOPIC_RETENTION_PARAM, take_retention
from debatebus.transports.base import Delivery

try:
    import hiredis

    _pack: Any = hiredis.pack_command
except ImportError:  # hiredis is optional (the redis extra brings it): fall back to redis-py's packer
    _pack = None

__all__ = [
    "NO_HEADERS",
    "Command",
    "ReadTracker",
    "RedisClient",
    "build_client",
    "check_client",
    "cluster_url",
    "connect_check",
    "describe",
    "is_cluster",
    "map_redis_errors",
    "merge",
    "pack_commands",
    "redis_call",
    "script_sha",
    "seed_names",
    "split_cluster",
    "split_seeds",
    "url_or_given",
]

log = logging.getLogger("debatebus.transports.redis")


def script_sha(script: str) -> str:
    """The SHA1 that Redis knows a Lua script by: what ``EVALSHA`` names it with."""
    return hashlib.sha1(script.encode()).hexdigest()

#: Shared by every delivery without headers: one less dict per message.
NO_HEADERS: Mapping[str, str] = MappingProxyType({})
#: A command as its arguments: ``("XADD", stream, "*", field, value…)``; str, bytes or int.
Command = tuple[Any, ...]
#: The client seam: one Redis server, or a Redis Cluster (``?cluster=true`` in the URL).
RedisClient: TypeAlias = Redis | RedisCluster
#: The URL parameter that asks for a Redis Cluster (any scheme: Streams, pub/sub, store, limiter).
_CLUSTER_PARAM = "cluster"
_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")
#: How Redis answers ``SELECT`` of a database number it does not have.
_NO_SUCH_DB = "DB index is out of range"


class _HiredisPacking:
    """Packs commands with hiredis's C packer: redis-py's asyncio connections use a pure-Python
    packer that costs ~3× more per command, which shows on a bus doing thousands per second."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str) and " " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [_pack(tuple(
                bytes(a) if isinstance(a, bytearray | memoryview) else a for a in args))]
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
    fast = _FAST.get(pool.connection_class) if _pack is not None else None
    if fast is not None:
        pool.connection_class = fast


def split_cluster(url: str) -> tuple[str, bool]:
    """``url`` without its ``cluster`` parameter (redis-py would hand it to every connection),
    and whether it asks for a Redis Cluster: ``?cluster=true`` (or yes/1/on; false/no/0/off)."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, False
    kept, cluster = [], False
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name != _CLUSTER_PARAM:
            kept.append(part)
        elif value.lower() in _TRUE:
            cluster = True
        elif value.lower() not in _FALSE:
            raise ConfigError(f"invalid Redis URL {redact(url)!r}: cluster= takes true or false,"
                              f" not {value!r}")
    return (f"{base}?{'&'.join(kept)}" if kept else base), cluster


def split_seeds(url: str) -> tuple[str, list[tuple[str, int]]]:
    """``url`` on its first host, and every host it names, in order: a cluster URL may name
    several seeds (``redis://node1:7000,node2:7000/0?cluster=true``), tried in turn."""
    scheme, sep, rest = url.partition("://")
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]  # tail: the db, query and fragment, if any
    auth, at, hosts = netloc.rpartition("@")
    seeds = []
    for seed in hosts.split(",") if hosts else ():
        try:
            parts = urlsplit(f"//{seed}")
            seeds.append((parts.hostname or "localhost", parts.port or 6379))  # redis-py's defaults
        except ValueError as e:  # a port that is not a number
            raise ConfigError(f"invalid Redis URL {redact(url)!r}: seed {seed!r}: {e}") from None
    return f"{scheme}{sep}{auth}{at}{hosts.partition(',')[0]}{tail}", seeds


def seed_names(url: str | None) -> list[str]:
    """``host:port`` of every seed a cluster URL names, in order; none for a URL without
    ``cluster=true`` (or no URL: a caller's own client). What a cluster batcher falls back to when
    no node it knows answers."""
    if url is None:
        return []
    plain, cluster = split_cluster(url)
    return [f"{host}:{port}" for host, port in split_seeds(plain)[1]] if cluster else []


def cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``?cluster=true``)."""
    return split_cluster(url)[1]


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
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries=2))
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


def _explain(error: BaseException, where: str) -> str:
    cause = f"({type(error).__name__}: {error})"
    if isinstance(error, redis_errors.TimeoutError | TimeoutError):
        return (f"Redis at {where} did not answer in time: check the server's load and the network,"
                f" or raise connect_timeout/command_timeout {cause}")
    if isinstance(error, ssl.SSLError):
        return (f"the TLS handshake with Redis at {where} failed: check the server's certificate"
                f" and the URL's ssl_* options (ssl_ca_certs, ssl_cert_reqs…) {cause}")
    if isinstance(error, redis_errors.MaxConnectionsError):  # a ConnectionError: before it
        return (f"every connection of the pool to Redis at {where} is in use: fewer calls at once,"
                f" or a client built with a larger max_connections {cause}")
    if isinstance(error, redis_errors.ConnectionError | OSError):
        return f"cannot reach Redis at {where}: is redis-server running there? {cause}"
    if isinstance(error, redis_errors.ReadOnlyError):
        return f"Redis at {where} is a read-only replica: point the URL at the primary {cause}"
    if isinstance(error, redis_errors.ResponseError) and str(error).startswith("WRONGTYPE"):
        return (f"Redis at {where}: a topic name is already used by a key that is not a stream;"
                f" rename the topic or delete that key {cause}")
    if isinstance(error, redis_errors.ResponseError) and str(error).startswith("NOGROUP"):
        return (f"Redis at {where}: the stream or its consumer group is gone (deleted while in"
                f" use?); consuming again recreates them {cause}")
    if isinstance(error, redis_errors.RedisClusterException):  # e.g. no seed node answers
        return (f"the Redis Cluster at {where} failed: does a node of it answer, with CLUSTER INFO"
                f" saying cluster_state:ok? {cause}")
    if isinstance(error, redis_errors.ResponseError):
        return (f"Redis at {where} rejected a command: check the server version (Streams consumer"
                f" groups need Redis >= 6.2) and its memory limit {cause}")
    return f"Redis at {where} failed: {cause}"


def _no_such_db(error: BaseException) -> bool:
    """Whether ``error`` is the server's answer to ``SELECT`` of a database it does not have."""
    return isinstance(error, redis_errors.ResponseError) and str(error).startswith(_NO_SUCH_DB)


def transport_error(error: BaseException, where: str) -> TransportError | ConfigError:
    """``error`` as the debatebus error callers catch, the original as its cause: a
    ``ConfigError`` for misconfiguration that retrying cannot fix (Redis refused the credentials,
    or has no database of the URL's number), a ``TransportError`` otherwise. Messages never quote
    the credentials."""
    mapped: TransportError | ConfigError
    if isinstance(error, redis_errors.AuthenticationError | redis_errors.AuthorizationError):
        mapped = ConfigError(f"Redis at {where} refused the credentials: check the user and"
                             f" password in the URL ({type(error).__name__}: {error})")
    elif _no_such_db(error):
        mapped = ConfigError(f"Redis at {where} has no database of the number in the URL (the"
                             f" /N after host:port): pick one it has ({error})")
    else:
        mapped = TransportError(_explain(error, where))
    mapped.__cause__ = error
    return mapped


@contextlib.contextmanager
def map_redis_errors(where: str) -> Iterator[None]:
    """Re-raise every redis-py (and socket) error as ``TransportError`` (``ConfigError`` for
    refused credentials), the original as cause."""
    try:
        yield
    except (redis_errors.RedisError, redis_errors.RedisClusterException, OSError) as e:
        raise transport_error(e, where) from e


@contextlib.asynccontextmanager
async def redis_call(where: str, timeout: float) -> AsyncIterator[None]:
    """A Redis call bounded by ``timeout`` seconds, its errors mapped to ``TransportError``."""
    with map_redis_errors(where):
        async with asyncio.timeout(timeout):
            yield


async def connect_check(client: RedisClient, where: str, timeout: float) -> None:
    """The check a Redis component makes when it connects: a PING bounded by ``timeout``, its
    errors mapped. A database the server does not have (``redis://host/99``) is a
    ``ConfigError`` that says how many it has: one more connection, on database 0, asks it."""
    try:
        async with redis_call(where, timeout):
            await client.ping()
    except ConfigError as e:
        cause = e.__cause__
        if is_cluster(client) or cause is None or not _no_such_db(cause):
            raise
        pool = cast(Redis, client).connection_pool  # a cluster has database 0 only
        db = pool.connection_kwargs.get("db")
        raise ConfigError(f"Redis at {where}: database {db} does not exist on this server"
                          f" ({await _databases(pool, timeout)}): fix the /N after host:port in"
                          " the URL") from cause


async def _databases(pool: ConnectionPool, timeout: float) -> str:
    """How many databases the server of ``pool`` has, in words (``CONFIG GET`` may be refused)."""
    first = Redis(connection_pool=ConnectionPool(
        connection_class=pool.connection_class, **{**pool.connection_kwargs, "db": 0}))
    try:
        async with asyncio.timeout(timeout):
            reply = await first.config_get("databases")  # redis-py decodes it: {"databases": "16"}
    except (redis_errors.RedisError, OSError, TimeoutError):
        reply = {}
    finally:
        await first.aclose(close_connection_pool=True)
    count = reply.get("databases") or ""
    if not count.isdigit():
        return "CONFIG GET databases was refused, so how many it has is unknown; 16 by default"
    return f"it has {count}: databases 0..{int(count) - 1}"


def _bulk(arg: Any) -> bytes:
    if isinstance(arg, bytes | bytearray | memoryview):
        return bytes(arg)  # no copy for bytes itself
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, int):
        return b"%d" % arg
    return str(arg).encode()


def _packed(command: Command) -> bytes:
    try:
        return bytes(_pack(tuple(command)))
    except TypeError:  # hiredis takes no bytearray: copy those (rare) arguments
        return bytes(_pack(tuple(bytes(a) if isinstance(a, bytearray) else a for a in command)))


def pack_commands(commands: Iterable[Command]) -> bytes:
    """RESP-encode ``commands`` into one buffer: what redis-py's packer does, without its per-
    argument encoder lookups, which cost more than the network here (hiredis's C packer when it
    is installed, a Python one otherwise)."""
    if _pack is not None:
        return b"".join([_packed(command) for command in commands])
    out = bytearray()
    for command in commands:
        out += b"*%d\r\n" % len(command)
        for arg in command:
            data = _bulk(arg)
            out += b"$%d\r\n" % len(data)
            out += data
            out += b"\r\n"
    return bytes(out)


class ReadTracker:
    """Counts blocking reads in flight, so ``close()`` lets them return before it closes the pool:
    a pool closed under a read makes redis-py's retry reconnect a socket that nobody closes."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        self._count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._count -= 1
            if not self._count:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)


async def merge(*sources: AsyncIterator[Delivery]) -> AsyncIterator[Delivery]:
    """Interleave several iterators until all end; the first error ends the merge and is raised."""
    queue: asyncio.Queue[Delivery | BaseException | None] = asyncio.Queue(maxsize=64)

    async def pump(source: AsyncIterator[Delivery]) -> None:
        try:
            async for item in source:
                await queue.put(item)
        except Exception as e:
            await queue.put(e)
        await queue.put(None)

    tasks = [asyncio.create_task(pump(source)) for source in sources]
    running = len(tasks)
    try:
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
