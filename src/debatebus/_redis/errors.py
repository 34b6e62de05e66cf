"""Redis errors as debatebus errors: every redis-py (and socket) error a Redis call raises becomes
the ``TransportError`` callers catch, or a ``ConfigError`` when retrying cannot help (refused
credentials, a database the server does not have); messages say what to check and never quote
the credentials."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Iterator

from redis import exceptions as redis_errors

from debatebus.exceptions import ConfigError, TransportError

#: How Redis answers ``SELECT`` of a database number it does not have.
_NO_SUCH_DB = "DB index is out of range"


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


def no_such_db(error: BaseException) -> bool:
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
    elif no_such_db(error):
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


