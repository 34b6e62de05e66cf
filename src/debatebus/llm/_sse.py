"""Server-sent events over HTTP/1.1, read straight from asyncio's transport: the path a streamed
answer takes from a provider.

Why not the SDKs' httpx: a provider writes a streamed answer a token per event, and httpx (through
httpcore, h11 and anyio) costs ~60-120 µs for each chunk it reads; read here, a token costs a few
µs (benchmarks/stream.py, docs/benchmarks.md). Two things make it cheap:

- **Paced reads.** With ``interval_s``, the first read takes what comes as soon as it comes,
  and the next ones wait for the ticks of ``debatebus.llm._base.next_tick`` (multiples of
  ``interval_s`` on the loop's clock): between two reads the transport is paused
  (``pause_reading``), the kernel buffers what the server writes, and the read at the tick takes
  all of it at once. A streamed turn publishes its text at the same ticks, so a read's text is
  published as soon as it is read (a token waits one interval at most), and concurrent streams
  are read, and their deltas published, in the same turn of the loop. When the server says its
  answer is ending (``EventSource.hurry``), the rest is read as it comes.
- **Batches.** Each read's events are handed on together (``EventSource.batches``), each the
  bytes of its ``data`` field (found by one regex scan of the read), for the provider to decode
  in one go.

What it does: one request (``POST``, the body given, ``Connection: close``: a connection per
stream), the response's status line and headers, and its body chunked, by length, or up to the
close. A status other than 200 is an ``HTTPStatusError`` with the body's first 64 KiB, which the
provider maps as it maps its SDK's status errors; a connection that fails or closes early is an
``OSError`` (``ConnectionError``), a wait of more than ``timeout`` without data a ``TimeoutError``.
HTTPS goes through ``ssl`` with the system's (or ``SSL_CERT_FILE``'s) trusted certificates, or
certifi's when neither is set. Providers reached through a proxy use their SDK's stream instead.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
import urllib.request
from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import Final, cast
from urllib.parse import urlsplit

import certifi

from debatebus.llm._base import next_tick

#: The most of a response's head, or of an error's body, that is read.
_MAX_HEAD: Final = 64 * 1024


class HTTPStatusError(Exception):
    """The server answered with ``status`` (not 200): its headers and body (text, cut)."""

    def __init__(self, status: int, headers: Mapping[str, str], body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.headers = dict(headers)
        self.body = body


def proxied(url: str) -> bool:
    """Whether the environment sends requests to ``url`` through a proxy (``HTTPS_PROXY``…)."""
    parts = urlsplit(url)
    return (parts.scheme in urllib.request.getproxies()
            and not urllib.request.proxy_bypass(parts.hostname or ""))


def _ssl_context() -> ssl.SSLContext:
    cafile = os.environ.get("SSL_CERT_FILE")
    capath = os.environ.get("SSL_CERT_DIR")
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile, capath=capath)
    return ssl.create_default_context(cafile=certifi.where())


class _Buffer(asyncio.Protocol):
    """What the connection received and not yet taken, and whether it has ended.

    ``wait`` pauses reading until a tick when asked to (what the server writes meanwhile waits
    in the kernel's buffer); ``timeout`` bounds how long a wait goes without data, checked by one
    timer per ``timeout`` seconds rather than one per read."""

    def __init__(self, timeout: float | None) -> None:
        self.data = bytearray()
        self.ended = False
        self.error: BaseException | None = None
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._timeout = timeout
        self._waiter: asyncio.Future[None] | None = None
        self._held: asyncio.TimerHandle | None = None  # reading paused until it fires
        self._watch: asyncio.TimerHandle | None = None  # the timeout's check
        self._waiting_since = 0.0  # the last data, or the start of the wait, on the loop's clock
        self._more_than = 0  # the bytes of data the wait is for more than

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport (uvloop's does not subclass asyncio.Transport: no isinstance).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.data += data
        self._waiting_since = self._loop.time()
        if self._held is None and len(self.data) > self._more_than:
            self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, until: float | None = None, *, more_than: int = 0) -> None:
        """Until there are more than ``more_than`` bytes or the connection has ended, and not
        before ``until`` (the loop's clock: reading is paused until then, unless the connection
        has ended, or ends meanwhile: what is left is all there is). ``TimeoutError`` after
        ``timeout`` s without data."""
        loop = self._loop
        self._more_than = more_than
        if until is not None and until > loop.time() and not self.ended:
            assert self.transport is not None
            self.transport.pause_reading()
            self._held = loop.call_at(until, self._release)
        elif len(self.data) > more_than or self.ended:
            return
        else:
            self._waiting_since = loop.time()
        self._waiter = loop.create_future()
        if self._timeout is not None and self._watch is None:
            self._watch = loop.call_at(self._waiting_since + self._timeout, self._check)
        try:
            await self._waiter
        finally:
            self._waiter = None
            self._cancel_hold()

    def _release(self) -> None:
        """The tick has come: read again, and hand on what is there."""
        self._held = None
        assert self.transport is not None
        self.transport.resume_reading()
        self._waiting_since = self._loop.time()
        if len(self.data) > self._more_than:
            self._wake()

    def _cancel_hold(self) -> None:
        if self._held is not None:  # the connection ended first
            self._held.cancel()
            self._held = None

    def _check(self) -> None:
        self._watch = None
        if self._waiter is None or self._waiter.done() or self._timeout is None:
            return  # re-armed by the next wait
        due = (self._loop.time() if self._held is not None else self._waiting_since) + self._timeout
        if due <= self._loop.time():
            self._waiter.set_exception(TimeoutError(
                f"no data from the server for {self._timeout:g} s"))
        else:
            self._watch = self._loop.call_at(due, self._check)

    def close(self) -> None:
        self._cancel_hold()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None


async def open_events(url: str, headers: Mapping[str, str], body: bytes, *,
                      timeout: float | None, interval_s: float = 0.0) -> EventSource:
    """``POST`` ``body`` to ``url`` and read the response's head: an ``EventSource`` when the
    server answers 200, else ``HTTPStatusError``. ``timeout`` bounds connecting and each wait for
    data (None: no bound); ``interval_s`` paces the reads of the body (0: as it comes)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"cannot stream from {url!r}: not an http(s) URL")
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        transport, buffer = await loop.create_connection(
            partial(_Buffer, timeout), parts.hostname, port,
            ssl=_ssl_context() if secure else None,
            server_hostname=parts.hostname if secure else None)
    source = EventSource(transport, buffer, interval_s)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
        lines = [f"POST {target} HTTP/1.1", f"Host: {host}", "Accept: text/event-stream",
                 "Accept-Encoding: identity", "Connection: close",
                 "Content-Type: application/json", f"Content-Length: {len(body)}",
                 *(f"{name}: {value}" for name, value in headers.items())]
        transport.write("\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body)
        await source.read_head(timeout)
    except BaseException:
        source.close()
        raise
    return source


class EventSource:
    """A response's server-sent events, read by ``batches``; ``close`` ends the connection."""

    def __init__(self, transport: asyncio.Transport, buffer: _Buffer, interval_s: float) -> None:
        self._transport = transport
        self._buffer = buffer
        self._interval_s = interval_s
        self._chunked = False
        self._left: int | None = None  # body bytes still to come, when its length is known
        self._body = bytearray()  # the body (de-chunked), not yet split into events
        self._raw = bytearray()  # chunked: what is not yet de-chunked

    async def read_head(self, timeout: float | None) -> None:
        buffer = self._buffer
        while (end := buffer.data.find(b"\r\n\r\n")) < 0:
            if len(buffer.data) > _MAX_HEAD:
                raise ConnectionError("the response's head is over 64 KiB")
            if buffer.ended:
                raise ConnectionError("the server closed the connection before it answered"
                                      ) from buffer.error
            await buffer.wait(more_than=len(buffer.data))
        head = bytes(buffer.data[:end]).decode("latin-1").split("\r\n")
        del buffer.data[:end + 4]
        try:
            status = int(head[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            raise ConnectionError(f"not an HTTP response: {head[0][:100]!r}") from None
        fields: dict[str, str] = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        self._chunked = "chunked" in fields.get("transfer-encoding", "").lower()
        if not self._chunked and "content-length" in fields:
            self._left = int(fields["content-length"])
        if status != 200:
            raise HTTPStatusError(status, fields, (await self._error_body(timeout)).decode(
                "utf-8", "replace"))

    async def _error_body(self, timeout: float | None) -> bytes:
        body = bytearray()
        self._interval_s = 0.0
        try:
            async with asyncio.timeout(timeout):
                async for data in self._reads():
                    body += data
                    if len(body) > _MAX_HEAD:
                        break
        except (OSError, TimeoutError):
            pass  # what came is enough to say what went wrong
        return bytes(body[:_MAX_HEAD])

    def hurry(self) -> None:
        """Read what comes as it comes from now on: the server said its answer is ending (a
        finish reason), so the rest is not held back to the next tick."""
        self._interval_s = 0.0

    async def batches(self) -> AsyncIterator[list[bytes]]:
        """The events' ``data``, a list per read (the events that arrived together), in order;
        events without data (comments, keep-alives) are left out."""
        body = self._body
        async for read in self._reads():
            body += read
            if b"\r" in body:
                body[:] = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            end = body.rfind(b"\n\n")
            if end < 0:
                continue
            found = _datas(bytes(body[:end]))
            del body[:end + 2]
            if found:
                yield found

    async def _reads(self) -> AsyncIterator[bytes]:
        """The body's bytes as they are read (de-chunked): the first read as soon as there is
        something, then at the ticks of ``next_tick`` while ``interval_s`` is set."""
        buffer = self._buffer
        loop = asyncio.get_running_loop()
        until: float | None = None
        if self._left == 0:
            return
        while True:
            await buffer.wait(until)
            if buffer.data:
                data = buffer.data
                buffer.data = bytearray()
                body, done = self._unframe(data)
                if body:
                    yield body
                if done:
                    return
            if buffer.ended and not buffer.data:
                if self._left is None and not self._chunked:
                    return  # a body up to the close
                raise ConnectionError("the server closed the connection before the response "
                                      "ended") from buffer.error
            interval_s = self._interval_s
            until = next_tick(loop.time(), interval_s) if interval_s > 0 else None

    def _unframe(self, data: bytearray) -> tuple[bytes, bool]:
        """The body in ``data`` (just read), and whether the body has ended."""
        if self._left is not None:
            body = bytes(data[:self._left])
            self._left -= len(body)
            return body, self._left == 0
        if not self._chunked:
            return bytes(data), False
        raw = self._raw
        raw += data
        out: list[bytearray] = []
        at, size = 0, len(raw)
        done = False
        while (line_end := raw.find(b"\r\n", at)) >= 0:
            try:
                length = int(raw[at:line_end], 16)
            except ValueError:  # a chunk extension (``;name=value``), or not a size
                length = _chunk_size(bytes(raw[at:line_end]))
            if length == 0:
                done = True  # the trailers, if any, are not read
                break
            start = line_end + 2
            if size < start + length + 2:
                break
            out.append(raw[start:start + length])
            at = start + length + 2
        del raw[:at]
        return b"".join(out), done

    def close(self) -> None:
        self._buffer.close()
        self._transport.close()


def _chunk_size(line: bytes) -> int:
    try:
        return int(line.split(b";", 1)[0], 16)
    except ValueError:
        raise ConnectionError(f"malformed chunk size {line[:40]!r}") from None


#: A data line; and a data line after another (an event of several lines: the slow path).
_DATA = re.compile(rb"^data: ?(.*)$", re.MULTILINE)
_SEVERAL = re.compile(rb"^data:.*\ndata:", re.MULTILINE)


def _datas(events: bytes) -> list[bytes]:
    """The ``data`` of each of ``events`` (blank-line separated) that has one: its ``data:``
    lines joined by newlines. One regex scan when no event has more than one data line."""
    if _SEVERAL.search(events) is None:
        return _DATA.findall(events)
    found = []
    for event in events.split(b"\n\n"):
        lines = _DATA.findall(event)
        if lines:
            found.append(b"\n".join(lines))
    return found
