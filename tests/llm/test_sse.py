"""``debatebus.llm._sse`` against local asyncio servers that write raw HTTP: bodies chunked (split
across reads at awkward places), by length and up to the close; errors (a status, a connection
closed early, a wait past the timeout); paced reads and ``hurry``; HTTPS with a certificate from
``SSL_CERT_FILE``; and the providers' fall-back to their SDK's stream through a proxy."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from debatebus.llm import LLMRequest, Message
from debatebus.llm._anthropic_llm import AnthropicLLM
from debatebus.llm._base import next_tick, tick
from debatebus.llm._openai_compat import OpenAICompatibleLLM
from debatebus.llm._retry import RetryPolicy
from debatebus.llm._sse import EventSource, HTTPStatusError, open_events
from tests.llm.servers import anthropic_events, chat_chunks

#: What a scripted server does with a connection, once the request's head and body are in.
Script = Callable[[asyncio.StreamWriter], Awaitable[None]]

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
REQUEST = LLMRequest("You are terse.", (Message("user", "Say hi."),))


class Seen:
    """What the server was sent: each request's line, headers and body."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.bodies: list[bytes] = []


@asynccontextmanager
async def serving(script: Script, *, tls: ssl.SSLContext | None = None,
                  host: str = "127.0.0.1") -> AsyncIterator[tuple[str, Seen]]:
    """A server on a free port that reads each request, then runs ``script``: its base URL."""
    seen = Seen()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            fields = dict(line.split(": ", 1) for line in head[1:] if line)
            seen.lines.append(head[0])
            seen.headers.append({k.lower(): v for k, v in fields.items()})
            length = int(fields.get("Content-Length", fields.get("content-length", "0")))
            seen.bodies.append(await reader.readexactly(length))
            await script(writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"{'https' if tls else 'http'}://{host}:{port}", seen


def writes(*pieces: bytes, pause: float = 0.03) -> Script:
    """Writes ``pieces`` one at a time, ``pause`` apart (each its own read at the other end)."""

    async def script(writer: asyncio.StreamWriter) -> None:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(pause)

    return script


def chunked(*events: bytes) -> bytes:
    """``events`` as a chunked body, a chunk each, and its last chunk."""
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


async def read_all(source: EventSource) -> list[list[bytes]]:
    try:
        return [batch async for batch in source.batches()]
    finally:
        source.close()


async def batches_from(url: str, *, timeout: float | None = 5.0,
                       interval_s: float = 0.0) -> list[list[bytes]]:
    source = await open_events(f"{url}/v1/stream", {"Authorization": "Bearer k"}, b'{"q":1}',
                               timeout=timeout, interval_s=interval_s)
    return await read_all(source)


def far_interval(at_least: float = 30.0) -> float:
    """An interval whose next tick is ``at_least`` s away: a read held to it would take that
    long (ticks are multiples of the interval on the loop's clock)."""
    now = asyncio.get_running_loop().time()
    return next(i for i in range(60, 600) if next_tick(now, i) - now > at_least)


async def collect(source: EventSource, got: list[bytes]) -> None:
    """Reads ``source``'s events into ``got`` until it ends or fails."""
    async for batch in source.batches():
        got.extend(batch)


def flat(batches: Sequence[Sequence[bytes]]) -> list[bytes]:
    return [data for batch in batches for data in batch]


EVENTS = [b'data: {"n":1}\n\n', b'data: {"n":2}\n\n', b'data: {"n":3}\n\n']
DATAS = [b'{"n":1}', b'{"n":2}', b'{"n":3}']


# ---- bodies -----------------------------------------------------------------------------------


async def test_a_chunked_body_split_across_reads_at_awkward_places() -> None:
    response = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(*EVENTS)
    body_at = len(HEAD) + len(b"Transfer-Encoding: chunked\r\n\r\n")
    cuts = [
        body_at + 1,  # inside the first chunk-size line ("e" of "e\r\n")
        body_at + 3,  # inside its CRLF (between \r and \n)
        body_at + 10,  # inside the first event's data
        body_at + 4 + len(EVENTS[0]) + 1,  # inside the CRLF that ends the first chunk
        len(response) - 6,  # inside the last chunk's size line and its CRLFs
        len(response) - 2,
    ]
    pieces = [response[a:b] for a, b in zip([0, *cuts], [*cuts, len(response)], strict=True)]
    async with serving(writes(*pieces)) as (url, seen):
        batches = await batches_from(url)
    assert flat(batches) == DATAS
    assert len(batches) == 3  # each event handed on once whole, never a part of one
    assert seen.lines == ["POST /v1/stream HTTP/1.1"]
    assert seen.headers[0]["authorization"] == "Bearer k"
    assert seen.headers[0]["accept"] == "text/event-stream"
    assert seen.bodies == [b'{"q":1}']


async def test_an_event_split_across_chunks_and_crlf_line_ends() -> None:
    event = b'event: message\r\ndata: {"a":\r\ndata: 1}\r\n\r\n: a comment\r\n\r\ndata: last\r\n\r\n'
    response = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(event[:9], event[9:30],
                                                                      event[30:])
    async with serving(writes(response)) as (url, _):
        batches = await batches_from(url)
    # Two data lines join with a newline; a comment (no data) is left out.
    assert flat(batches) == [b'{"a":\n1}', b"last"]


async def test_a_body_by_content_length_ends_with_its_length() -> None:
    body = b"".join(EVENTS)
    head = HEAD + b"Content-Length: %d\r\n\r\n" % len(body)

    async def then_hang(writer: asyncio.StreamWriter) -> None:
        await writes(head + body[:20], body[20:] + b"past the length")(writer)
        await asyncio.sleep(5)  # the body is over: the reader must not wait for the close

    async with serving(then_hang) as (url, _):
        batches = await asyncio.wait_for(batches_from(url), 3)
    assert flat(batches) == DATAS


async def test_a_body_without_length_ends_at_the_close() -> None:
    async with serving(writes(HEAD + b"\r\n" + EVENTS[0], EVENTS[1] + EVENTS[2][:5],
                              EVENTS[2][5:])) as (url, _):
        batches = await batches_from(url)
    assert flat(batches) == DATAS


# ---- errors -----------------------------------------------------------------------------------


async def test_a_status_other_than_200_is_an_error_with_the_body() -> None:
    body = b'{"error": {"message": "slow down"}}'
    response = (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    async with serving(writes(response[:40], response[40:])) as (url, _):
        with pytest.raises(HTTPStatusError) as raised:
            await batches_from(url)
    error = raised.value
    assert (error.status, error.headers["retry-after"]) == (429, "7")
    assert json.loads(error.body) == {"error": {"message": "slow down"}}
    assert "HTTP 429" in str(error)


@pytest.mark.parametrize("framing", ["chunked", "length"])
async def test_a_connection_closed_before_the_body_ended(framing: str) -> None:
    if framing == "chunked":
        response = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(*EVENTS)[:-5]
    else:
        response = HEAD + b"Content-Length: 500\r\n\r\n" + b"".join(EVENTS)
    got: list[bytes] = []
    async with serving(writes(response)) as (url, _):
        source = await open_events(url, {}, b"{}", timeout=5.0)
        with pytest.raises(ConnectionError, match="closed the connection before the response"):
            await collect(source, got)
        source.close()
    assert got == DATAS  # what came before the close was handed on


async def test_a_connection_closed_before_the_head() -> None:
    async with serving(writes(b"HTTP/1.1 200 OK\r\nContent-")) as (url, _):
        with pytest.raises(ConnectionError, match="before it answered"):
            await batches_from(url)


async def test_a_wait_past_the_timeout_is_a_timeout_error() -> None:
    async def stall(writer: asyncio.StreamWriter) -> None:
        await writes(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(EVENTS[0])[:-5])(
            writer)
        await asyncio.sleep(10)

    got: list[bytes] = []
    async with serving(stall) as (url, _):
        source = await open_events(url, {}, b"{}", timeout=0.3)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await collect(source, got)
        source.close()
        waited = loop.time() - started
    assert got == [DATAS[0]]
    assert 0.25 < waited < 5  # the timeout, not the server's 10 s


# ---- pacing -----------------------------------------------------------------------------------


async def test_paced_reads_take_what_arrived_at_each_tick() -> None:
    events = [b'data: {"n":%d}\n\n' % n for n in range(12)]
    async with serving(writes(HEAD + b"\r\n", *events, pause=0.05)) as (url, _):
        source = await open_events(url, {}, b"{}", timeout=5.0, interval_s=0.25)
        loop = asyncio.get_running_loop()
        ticks = []
        batches = []
        async for batch in source.batches():
            batches.append(batch)
            ticks.append(tick(loop.time(), 0.25))
        source.close()
    assert flat(batches) == [e[6:-2] for e in events]
    # 12 events over ~0.6 s: the first read at once, then one read a tick, never two.
    assert len(batches) < 6
    assert len(set(ticks)) == len(ticks)


async def test_hurry_reads_the_rest_as_it_comes() -> None:
    async with serving(writes(HEAD + b"\r\n", EVENTS[0], EVENTS[1], EVENTS[2], pause=0.05)
                       ) as (url, _):
        source = await open_events(url, {}, b"{}", timeout=5.0, interval_s=far_interval())
        loop = asyncio.get_running_loop()
        started = loop.time()
        batches = []
        async for batch in source.batches():
            batches.append(batch)
            source.hurry()  # the first batch said the answer is ending
        source.close()
        elapsed = loop.time() - started
    assert flat(batches) == DATAS
    assert elapsed < 10  # not held to the next tick, 30 s away


# ---- HTTPS ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


async def test_https_trusts_the_certificate_of_ssl_cert_file(
        certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = certificate
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    response = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(*EVENTS)
    async with serving(writes(response[:50], response[50:]), tls=tls) as (url, seen):
        url = url.replace("127.0.0.1", "localhost")
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        with pytest.raises(ssl.SSLCertVerificationError):  # self-signed: not trusted
            await batches_from(url)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        batches = await batches_from(url)
    assert flat(batches) == DATAS
    assert seen.lines[-1] == "POST /v1/stream HTTP/1.1"


# ---- the providers ----------------------------------------------------------------------------


def sse_body(events: Sequence[bytes]) -> bytes:
    return HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(*events)


async def test_openai_ends_a_paced_stream_once_it_says_the_answer_is_written() -> None:
    events = chat_chunks(["Hello", " there"], completion_tokens=2)
    # The text, then (a moment later, past the first read) the usage chunk and [DONE].
    async with serving(writes(sse_body(events)[:-80], sse_body(events)[-80:], pause=0.1)
                       ) as (url, seen):
        llm = OpenAICompatibleLLM("m", base_url=f"{url}/v1",
                                  retry_policy=RetryPolicy(max_retries=0, timeout=5))
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with llm.stream(REQUEST, interval_s=far_interval()) as stream:
            pieces = [piece async for piece in stream]
        elapsed = loop.time() - started
    assert "".join(pieces) == "Hello there"
    assert stream.response is not None and stream.response.usage is not None
    assert elapsed < 10  # the end was not held to the next tick, 30 s away
    assert seen.lines == ["POST /v1/chat/completions HTTP/1.1"]


async def test_anthropic_streams_through_sse_with_its_headers_paced() -> None:
    pieces = ["Hello", " there", ", how", " are", " you", "?"]
    events = anthropic_events(pieces, input_tokens=12, output_tokens=7)
    async with serving(writes(HEAD + b"\r\n", *events, pause=0.05)) as (url, seen):
        llm = AnthropicLLM("claude-x", api_key="sk-test-key", base_url=url, temperature=0.5,
                           retry_policy=RetryPolicy(max_retries=0, timeout=5))
        async with llm.stream(REQUEST, interval_s=0.2) as stream:
            got = [piece async for piece in stream]
    assert "".join(got) == "".join(pieces)
    assert len(got) < len(pieces)  # paced: what arrived between two ticks in one piece
    assert stream.response is not None
    assert (stream.response.usage.prompt_tokens, stream.response.usage.completion_tokens) == (
        12, 7)
    assert seen.lines == ["POST /v1/messages HTTP/1.1"]
    headers = seen.headers[0]
    # The SDK's headers: its key (``Authorization`` or ``X-Api-Key``, by SDK version) and
    # its API version.
    assert any(value.endswith("sk-test-key") for value in headers.values())
    assert "anthropic-version" in headers
    body = json.loads(seen.bodies[0])
    assert (body["stream"], body["temperature"], body["system"]) == (True, 0.5, "You are terse.")
    assert body["model"] == "claude-x"


async def read_stream(llm: AnthropicLLM) -> str:
    async with llm.stream(REQUEST) as stream:
        return "".join([piece async for piece in stream])


async def test_anthropic_says_what_the_server_reported_mid_stream() -> None:
    from debatebus.exceptions import LLMError

    error = b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", ' \
            b'"message": "Overloaded"}}\n\n'
    events = anthropic_events(["Hi"])
    async with serving(writes(sse_body([*events[:3], error]))) as (url, _):
        llm = AnthropicLLM("claude-x", api_key="k", base_url=url,
                           retry_policy=RetryPolicy(max_retries=0, timeout=5))
        with pytest.raises(LLMError, match="the server reported an error: Overloaded"):
            await read_stream(llm)


async def proxy_answering(events: Sequence[bytes]) -> Script:
    return writes(sse_body(events))


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_through_a_proxy_the_stream_is_the_sdks(
        provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pieces = ["Hello", " there"]
    events = (chat_chunks(pieces, completion_tokens=2) if provider == "openai"
              else anthropic_events(pieces))
    # The "proxy" answers itself: what matters is that the request came to it, in a proxy's form.
    async with serving(await proxy_answering(events)) as (proxy, seen):
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY",
                     "https_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.setenv("http_proxy", proxy)
        policy = RetryPolicy(max_retries=0, timeout=5)
        llm: OpenAICompatibleLLM | AnthropicLLM = (
            OpenAICompatibleLLM("m", base_url="http://api.example.invalid/v1",
                                retry_policy=policy) if provider == "openai"
            else AnthropicLLM("claude-x", api_key="k", base_url="http://api.example.invalid",
                              retry_policy=policy))
        async with llm.stream(REQUEST, interval_s=0.1) as stream:
            got = [piece async for piece in stream]
        await llm.aclose()
    assert "".join(got) == "Hello there"
    path = "/v1/chat/completions" if provider == "openai" else "/v1/messages"
    # The absolute form a client sends a proxy: the SDK's httpx, not debatebus.llm._sse.
    assert seen.lines == [f"POST http://api.example.invalid{path} HTTP/1.1"]
