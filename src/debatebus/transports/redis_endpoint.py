"""Where and how the Redis batcher connects (``Endpoint``: host or unix socket, TLS, AUTH, the
client's name, SELECT, read from a redis-py client's public pool settings) and how it reads error
replies (``reply_error``: an error reply → the redis-py exception it stands for)."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import ConnectionPool
from redis.asyncio.connection import SSLConnection

from debatebus.exceptions import ConfigError
from debatebus.transports.redis_common import Command

__all__ = ["Endpoint", "reply_error", "tls_context"]

#: Error replies by their first word, as redis-py's public exception classes (so ``NOSCRIPT`` is a
#: ``NoScriptError``); anything else is a ``ResponseError``. The message keeps the first word.
_ERRORS_BY_CODE: Mapping[str, type[redis_errors.RedisError]] = {
    "WRONGPASS": redis_errors.AuthenticationError,
    "NOAUTH": redis_errors.AuthenticationError,
    "NOPERM": redis_errors.NoPermissionError,
    "LOADING": redis_errors.BusyLoadingError,
    "NOSCRIPT": redis_errors.NoScriptError,
    "READONLY": redis_errors.ReadOnlyError,
    "OOM": redis_errors.OutOfMemoryError,
    "MASTERDOWN": redis_errors.MasterDownError,
    "TRYAGAIN": redis_errors.TryAgainError,
}
#: ``ERR`` replies worth a class of their own, by how their text starts.
_ERR_BY_TEXT: Mapping[str, type[redis_errors.RedisError]] = {
    "ERR max number of clients reached": redis_errors.ConnectionError,
    "ERR invalid password": redis_errors.AuthenticationError,
    "ERR AUTH <password> called without any password": redis_errors.AuthenticationError,
    "ERR Client sent AUTH, but no password is set": redis_errors.AuthenticationError,
}

_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def reply_error(text: str) -> redis_errors.RedisError:
    """hiredis's ``replyError`` hook: an error reply → the redis-py exception it stands for."""
    kind = _ERRORS_BY_CODE.get(text.split(" ", 1)[0])
    if kind is None and text.startswith("ERR "):
        kind = next((k for prefix, k in _ERR_BY_TEXT.items() if text.startswith(prefix)), None)
    return (kind or redis_errors.ResponseError)(text)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The connection settings, read from the client's public pool settings."""

    host: str
    port: int
    path: str | None
    tls: ssl.SSLContext | None
    connect_timeout: float
    keepalive: bool
    db: int
    client_name: str | None
    username: str | None = field(repr=False)
    password: str | None = field(repr=False)
    credentials: Any = field(repr=False)  # a redis-py CredentialProvider, or None

    @classmethod
    def of(cls, pool: ConnectionPool, default_timeout: float) -> Endpoint:
        kwargs: Mapping[str, Any] = pool.connection_kwargs
        if "host" not in kwargs and "path" not in kwargs:  # e.g. a Sentinel-managed pool
            raise ConfigError("the Redis batcher needs a client with a host and port or a unix "
                              "socket path (a redis://, rediss:// or unix:// URL)")
        tls = tls_context(kwargs) if issubclass(pool.connection_class, SSLConnection) else None
        timeout = kwargs.get("socket_connect_timeout") or default_timeout
        return cls(host=str(kwargs.get("host") or "localhost"), port=int(kwargs.get("port") or 6379),
                   path=kwargs.get("path"), tls=tls, connect_timeout=float(timeout),
                   keepalive=bool(kwargs.get("socket_keepalive")), db=int(kwargs.get("db") or 0),
                   client_name=kwargs.get("client_name"), username=kwargs.get("username"),
                   password=kwargs.get("password"), credentials=kwargs.get("credential_provider"))

    def handshake(self) -> list[Command]:
        """What to send before the first pipeline: AUTH, the client's name, SELECT. Never HELLO:
        the connection stays on RESP2."""
        username, password = self.username, self.password
        if self.credentials is not None:
            *user, password = self.credentials.get_credentials()
            username = user[0] if user else None
        commands: list[Command] = []
        if password:
            commands.append(("AUTH", username, password) if username else ("AUTH", password))
        if self.client_name:
            commands.append(("CLIENT", "SETNAME", self.client_name))
        if self.db:
            commands.append(("SELECT", self.db))
        return commands


def tls_context(options: Mapping[str, Any]) -> ssl.SSLContext:
    """An ``SSLContext`` from redis-py's ``ssl_*`` options, with redis-py's defaults."""
    reqs = options.get("ssl_cert_reqs") or "required"
    if isinstance(reqs, str):
        if reqs.lower() not in _CERT_REQS:
            raise ConfigError(f"ssl_cert_reqs must be none, optional or required, not {reqs!r}")
        reqs = _CERT_REQS[reqs.lower()]
    context = ssl.create_default_context()
    context.check_hostname = bool(options.get("ssl_check_hostname", True)) and reqs != ssl.CERT_NONE
    context.verify_mode = reqs
    for flag in options.get("ssl_include_verify_flags") or ():
        context.verify_flags |= flag
    for flag in options.get("ssl_exclude_verify_flags") or ():
        context.verify_flags &= ~flag
    try:
        if options.get("ssl_certfile") or options.get("ssl_keyfile"):
            context.load_cert_chain(options.get("ssl_certfile") or "", options.get("ssl_keyfile"),
                                    password=options.get("ssl_password"))
        if options.get("ssl_ca_certs") or options.get("ssl_ca_data") or options.get("ssl_ca_path"):
            context.load_verify_locations(cafile=options.get("ssl_ca_certs"),
                                          capath=options.get("ssl_ca_path"),
                                          cadata=options.get("ssl_ca_data"))
        if options.get("ssl_min_version") is not None:
            context.minimum_version = options["ssl_min_version"]
        if options.get("ssl_ciphers"):
            context.set_ciphers(options["ssl_ciphers"])
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
        raise ConfigError(f"cannot use the TLS files or options given for Redis: {e}") from e
    return context
