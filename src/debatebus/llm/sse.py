"""Server-sent events over HTTP/1.1, read straight from asyncio's transport: the path a streamed
answer takes from a provider.

Why not the SDKs' httpx: a provider writes a streamed answer a token per event, and httpx (through
httpcore, h11 and anyio) costs ~60-120 µs for each chunk it reads; read here, a token costs a few
µs (benchmarks/stream.py, docs/benchmarks.md). Two things make it cheap:

- **Paced reads.** With ``interval_s``, the connection is read at most that often: between two
  reads the transport is paused (``pause_reading``), the kernel buffers what the server writes,
  and the next read takes all of it at once. A turn's text is published every
  ``stream_interval_s`` anyway, so reading that often adds nothing to how late it arrives.
- **Batches.** Each read's events are handed on together (``EventSource.batches``), each the
  bytes of its ``data`` field, for the provider to decode in one go.

What it does: one request (``POST``, the body given, ``Connection: close``: a connection per
stream), the response's status line and headers, and its body chunked, by length, or up to the
close. A status other than 200 is an ``HTTPStatusError`` with the body's first 64 KiB, which the
provider maps as it maps its SDK's status errors; a connection that fails or closes early is an
``OSError`` (``ConnectionError``), a read that waits longer than ``timeout`` a ``TimeoutError``.
HTTPS goes through ``ssl`` with the system's (or ``SSL_CERT_FILE``'s) trusted certificates, or
certifi's when neither is set. Providers reached through a proxy use their SDK's stream instead.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import Final, cast
from urllib.parse import urlsplit

import certifi

__all__ = ["EventSource", "HTTPStatusError", "open_events", "proxied"]

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
    """What the connection received and not yet taken, and whether it has ended."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.ended = False
        self.error: BaseException | None = None
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport (uvloop's does not subclass asyncio.Transport: no isinstance).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.data += data
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

    async def more(self, timeout: float | None) -> None:
        """Wait until something arrives or the connection ends (``TimeoutError`` after
        ``timeout`` s)."""
        if self.ended:
            raise ConnectionError("the server closed the connection before the response ended")
        self._waiter = asyncio.get_running_loop().create_future()
        async with asyncio.timeout(timeout):
            await self._waiter
        if self.ended and not self.data:
            raise ConnectionError("the server closed the connection before the response ended"
                                  ) from self.error


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
            _Buffer, parts.hostname, port, ssl=_ssl_context() if secure else None,
            server_hostname=parts.hostname if secure else None)
    source = EventSource(transport, buffer, timeout, interval_s)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
        lines = [f"POST {target} HTTP/1.1", f"Host: {host}", "Accept: text/event-stream",
                 "Accept-Encoding: identity", "Connection: close",
                 "Content-Type: application/json", f"Content-Length: {len(body)}",
                 *(f"{name}: {value}" for name, value in headers.items())]
        transport.write("\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body)
        await source.read_head()
    except BaseException:
        source.close()
        raise
    return source


class EventSource:
    """A response's server-sent events, read by ``batches``; ``close`` ends the connection."""

    def __init__(self, transport: asyncio.Transport, buffer: _Buffer, timeout: float | None,
                 interval_s: float) -> None:
        self._transport = transport
        self._buffer = buffer
        self._timeout = timeout
        self._interval_s = interval_s
        self._chunked = False
        self._left: int | None = None  # body bytes still to come, when its length is known
        self._body = bytearray()  # the body (de-chunked), not yet split into events
        self._raw = bytearray()  # chunked: what is not yet de-chunked

    async def read_head(self) -> None:
        buffer = self._buffer
        while (end := buffer.data.find(b"\r\n\r\n")) < 0:
            if len(buffer.data) > _MAX_HEAD:
                raise ConnectionError("the response's head is over 64 KiB")
            await buffer.more(self._timeout)
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
            raise HTTPStatusError(status, fields, (await self._error_body()).decode(
                "utf-8", "replace"))

    async def _error_body(self) -> bytes:
        body = bytearray()
        try:
            async with asyncio.timeout(self._timeout):
                async for data in self._reads(0.0):
                    body += data
                    if len(body) > _MAX_HEAD:
                        break
        except (OSError, TimeoutError):
            pass  # what came is enough to say what went wrong
        return bytes(body[:_MAX_HEAD])

    async def batches(self) -> AsyncIterator[list[bytes]]:
        """The events' ``data``, a list per read (the events that arrived together), in order;
        events without data (comments, keep-alives) are left out."""
        body = self._body
        async for read in self._reads(self._interval_s):
            body += read
            if b"\r" in body:
                body[:] = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            end = body.rfind(b"\n\n")
            if end < 0:
                continue
            events = bytes(body[:end]).split(b"\n\n")
            del body[:end + 2]
            found = [data for event in events if (data := _data(event)) is not None]
            if found:
                yield found

    async def _reads(self, interval_s: float) -> AsyncIterator[bytes]:
        """The body's bytes as they are read (de-chunked), at most every ``interval_s``."""
        buffer = self._buffer
        loop = asyncio.get_running_loop()
        read_at = -interval_s  # the first read is not held back
        while True:
            if buffer.data:
                data = bytes(buffer.data)
                buffer.data.clear()
                body, done = self._unframe(data)
                if body:
                    yield body
                if done:
                    return
            elif buffer.ended and self._left is None and not self._chunked:
                return  # a body up to the close
            else:
                wait = read_at + interval_s - loop.time()
                if wait > 0:  # what the server writes meanwhile waits in the kernel's buffer
                    self._transport.pause_reading()
                    await asyncio.sleep(wait)
                    self._transport.resume_reading()
                if not buffer.data:
                    await buffer.more(self._timeout)
                read_at = loop.time()

    def _unframe(self, data: bytes) -> tuple[bytes, bool]:
        """The body in ``data`` (just read), and whether the body has ended."""
        if self._left is not None:
            body = data[:self._left]
            self._left -= len(body)
            return body, self._left == 0
        if not self._chunked:
            return data, False
        raw = self._raw
        raw += data
        out = bytearray()
        while True:
            line_end = raw.find(b"\r\n")
            if line_end < 0:
                return bytes(out), False
            try:
                size = int(bytes(raw[:line_end]).split(b";", 1)[0], 16)
            except ValueError:
                raise ConnectionError(f"malformed chunk size {bytes(raw[:line_end][:40])!r}"
                                      ) from None
            if size == 0:
                return bytes(out), True  # the trailers, if any, are not read
            start = line_end + 2
            if len(raw) < start + size + 2:
                return bytes(out), False
            out += raw[start:start + size]
            del raw[:start + size + 2]

    def close(self) -> None:
        self._transport.close()


def _data(event: bytes) -> bytes | None:
    """An event's ``data`` (its ``data:`` lines joined by newlines), None when it has none."""
    if event.startswith(b"data:") and b"\n" not in event:  # the usual event: one data line
        return event[6:] if event[5:6] == b" " else event[5:]
    lines = [line[6:] if line[5:6] == b" " else line[5:]
             for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None
