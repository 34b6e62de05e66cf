"""The batcher's own connection to one Redis server: where and how it connects (``Endpoint``:
host or unix socket, TLS, AUTH, the client's name, SELECT, read from a redis-py client's public
pool settings), the handshake, the commands packed (``pack_commands``: hiredis's C packer) and
the replies read (hiredis's ``Reader``; ``reply_error``: an error reply → the redis-py exception
it stands for), pipeline by pipeline (``Wire``).

**The connection speaks RESP2, whatever the URL says**: it never sends ``HELLO``, so
``?protocol=3`` applies to the client's connections, not to this one, and no RESP3 push frame can
arrive on it. As a defence all the same, every pipeline ends with ``ECHO <token>``: a pipeline is
complete only once its last reply is its own token, so a frame nobody asked for (which would shift
every later reply by one) fails the pipelines in flight and closes the connection instead of
handing one caller another's reply. (So the Redis user needs ``ECHO``, which ``+@all`` and
``+@connection`` include.)

Pipelines are written back to back without waiting for the previous one's replies; hiredis parses
each chunk of replies the moment it arrives and each pipeline is resolved from that callback,
which spares a task switch per pipeline and a coroutine per reply.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import ssl
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import hiredis
from redis import exceptions as redis_errors
from redis.asyncio import ConnectionPool
from redis.asyncio.connection import SSLConnection

from debatebus._redis.errors import transport_error
from debatebus.exceptions import ConfigError

#: A command as its arguments: ``("XADD", stream, "*", field, value…)``; str, bytes or int.
Command = tuple[Any, ...]

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

#: hiredis's C packer: one command's arguments → its RESP bytes (its stub says a 1-tuple).
_pack: Callable[[tuple[Any, ...]], bytes] = hiredis.pack_command
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


def pack_command(command: Command) -> bytes:
    """One command in RESP, by hiredis's C packer (``TypeError`` for an argument it can't take)."""
    try:
        return bytes(_pack(tuple(command)))
    except TypeError:  # hiredis takes no bytearray: copy those (rare) arguments
        return bytes(_pack(tuple(bytes(a) if isinstance(a, bytearray) else a
                                 for a in command)))


def pack_commands(commands: Iterable[Command]) -> bytes:
    """RESP-encode ``commands`` into one buffer with hiredis's C packer: what redis-py's packer
    does, without its per-argument encoder lookups, which cost more than the network here."""
    return b"".join([pack_command(command) for command in commands])


# ---- the wire ---------------------------------------------------------------------------------

_MORE = object()  # hiredis: not enough data for a whole reply yet

@dataclass(slots=True, eq=False)
class Pipeline:
    """One pipeline on the wire: its jobs and the replies collected so far.
    ``resolve(pipeline, error)`` is called once, from the loop, when it ends either way."""

    jobs: list[Any]  # the batcher's, resolved by ``resolve``
    resolve: Callable[[Pipeline, BaseException | None], None]
    expected: int = 0
    marker: bytes = b""
    replies: list[Any] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class Wire(asyncio.Protocol):
    """The batcher's own connection: pipelines in, replies out, in order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.inflight: deque[Pipeline] = deque()
        self.lost: BaseException | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sent = 0
        self.reader = hiredis.Reader(protocolError=redis_errors.InvalidResponse,
                                     replyError=reply_error, notEnoughData=_MORE)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def send(self, pipeline: Pipeline, commands: Sequence[Command]) -> None:
        """Writes ``commands`` then this pipeline's ``ECHO`` marker (``pack_commands`` errors
        propagate: nothing is written then)."""
        self.sent += 1
        marker = b"debatebus:%d" % self.sent
        payload = pack_commands(itertools.chain(commands, (("ECHO", marker),)))
        assert self.transport is not None and self.lost is None
        pipeline.expected, pipeline.marker = len(commands) + 1, marker
        self.inflight.append(pipeline)
        self.transport.write(payload)

    def data_received(self, data: bytes) -> None:
        if self.lost is not None:
            return
        try:
            self.reader.feed(data)
            while (reply := self.reader.gets()) is not _MORE:
                self._take(reply)
        except Exception as e:  # garbage on the wire, or a reply nobody asked for
            self.fail(e)

    def _take(self, reply: Any) -> None:
        if not self.inflight:
            raise redis_errors.InvalidResponse(f"Redis sent {reply!r} while no command was waiting")
        pipeline = self.inflight[0]
        pipeline.replies.append(reply)
        if len(pipeline.replies) < pipeline.expected:
            return
        if isinstance(reply, redis_errors.RedisError):  # ECHO refused (NOAUTH, NOPERM): the
            raise reply                                # replies can't be checked, so none count
        if reply != pipeline.marker:  # some frame in between was no reply to ours: all shifted
            raise redis_errors.InvalidResponse("Redis sent more replies than commands: a frame "
                                               "that answers none of them came in between")
        pipeline.replies.pop()
        self.inflight.popleft()
        pipeline.resolve(pipeline, None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(redis_errors.ConnectionError(
            "Connection closed by server." if exc is None else f"Connection lost: {exc}"))
        if not self.closed.done():
            self.closed.set_result(None)

    def fail(self, error: BaseException) -> None:
        """Every pipeline without all its replies fails: the stream of replies can't be trusted."""
        if self.lost is None:
            self.lost = error
            if self.transport is not None:
                self.transport.abort()
        while self.inflight:
            pipeline = self.inflight.popleft()
            pipeline.resolve(pipeline, self.lost)


async def open_wire(endpoint: Endpoint, where: str) -> Wire:
    """A new connection, handshake done, within the endpoint's connect timeout."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(endpoint.connect_timeout):
        if endpoint.path is not None:
            _, wire = await loop.create_unix_connection(Wire, endpoint.path)
        else:
            _, wire = await loop.create_connection(
                Wire, endpoint.host, endpoint.port, ssl=endpoint.tls,
                server_hostname=endpoint.host if endpoint.tls is not None else None)
        try:
            if endpoint.keepalive and endpoint.path is None and wire.transport is not None:
                sock = wire.transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            await _handshake(wire, endpoint.handshake(), where)
        except BaseException:
            wire.fail(redis_errors.ConnectionError("handshake failed"))
            raise
    return wire


async def _handshake(wire: Wire, commands: list[Command], where: str) -> None:
    if not commands:
        return
    done: asyncio.Future[tuple[list[Any], BaseException | None]] = (
        asyncio.get_running_loop().create_future())

    def resolve(pipeline: Pipeline, error: BaseException | None) -> None:
        if not done.done():
            done.set_result((pipeline.replies, error))

    wire.send(Pipeline([], resolve), commands)
    replies, error = await done
    # A refused AUTH makes every later reply a NOAUTH: the first refusal is the one to report.
    for command, reply in zip(commands, replies, strict=False):
        if not isinstance(reply, Exception):
            continue
        if command[0] == "SELECT" and isinstance(reply, redis_errors.ResponseError):
            raise ConfigError(f"Redis at {where} refused to select db {command[1]}: check the db "
                              f"number in the URL ({reply})") from reply
        raise transport_error(reply, where)  # refused credentials: a ConfigError
    if error is not None:
        raise error
