"""Real HTTP servers for the provider tests: a scriptable fake API and llama-cpp-python's server.

``FakeAPI`` is a starlette app on uvicorn in a background thread (its own event loop, so it serves
tests running on any loop). Tests queue ``Reply``s; each request takes the next one, or a default
success in the shape of the path's API (Chat Completions or Messages). Every request is recorded.
A reply with ``stream`` sends server-sent events (``chat_chunks``, ``anthropic_events``) one
write at a time, and with ``break_off`` drops the connection before the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.servers import free_port

__all__ = ["FakeAPI", "LlamaServer", "Recorded", "Reply", "anthropic_events", "anthropic_message",
           "chat_chunks", "chat_completion"]


def chat_completion(
    text: str = "ok", prompt_tokens: int = 11, completion_tokens: int = 3
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "fake-model",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def anthropic_message(
    text: str = "ok", input_tokens: int = 10, output_tokens: int = 4, **usage: int
) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "fake-claude",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens, **usage},
    }


def _event(data: Any, name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def chat_chunks(pieces: list[str], prompt_tokens: int = 11,
                completion_tokens: int | None = None) -> tuple[bytes, ...]:
    """A streamed chat completion: a chunk per piece, the usage chunk, then ``[DONE]``."""
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                "model": "fake-model",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    answer = len(pieces) if completion_tokens is None else completion_tokens
    usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
             "model": "fake-model", "choices": [],
             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": answer,
                       "total_tokens": prompt_tokens + answer}}
    return (_event(chunk({"role": "assistant", "content": ""})),
            *(_event(chunk({"content": piece})) for piece in pieces),
            _event(chunk({}, "stop")), _event(usage), b"data: [DONE]\n\n")


def anthropic_events(pieces: list[str], input_tokens: int = 10,
                     output_tokens: int | None = None) -> tuple[bytes, ...]:
    """A streamed Messages answer: its start, a text delta per piece, its usage and its stop."""
    answer = len(pieces) if output_tokens is None else output_tokens
    start = {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "fake-claude",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1}}}
    return (
        _event(start, "message_start"),
        _event({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}, "content_block_start"),
        *(_event({"type": "content_block_delta", "index": 0,
                  "delta": {"type": "text_delta", "text": piece}}, "content_block_delta")
          for piece in pieces),
        _event({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        _event({"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                   "stop_sequence": None},
                "usage": {"output_tokens": answer}}, "message_delta"),
        _event({"type": "message_stop"}, "message_stop"),
    )


def anthropic_error(status: int, kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "status": status}


@dataclass(frozen=True)
class Reply:
    status: int = 200
    json: Any = None
    text: str | None = None  # sent verbatim instead of ``json`` (malformed bodies)
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    content_type: str = "application/json"
    stream: tuple[bytes, ...] | None = None  # server-sent events, written one by one
    stream_delay: float = 0.0  # before each of them
    break_off: bool = False  # drop the connection after the stream's first half


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


def _default(path: str) -> Reply:
    if path.endswith("/messages"):
        return Reply(json=anthropic_message())
    return Reply(json=chat_completion())


async def _written(reply: Reply) -> Any:
    assert reply.stream is not None
    events = reply.stream[: len(reply.stream) // 2] if reply.break_off else reply.stream
    for event in events:
        if reply.stream_delay:
            await asyncio.sleep(reply.stream_delay)
        yield event
    if reply.break_off:
        raise ConnectionAbortedError("the fake API drops the stream")  # uvicorn cuts it off


class FakeAPI:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        self.replies.clear()
        self.requests.clear()

    def plan(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]

    async def _handle(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self.requests.append(
            Recorded(request.method, request.url.path, dict(request.headers), body)
        )
        reply = self.replies.popleft() if self.replies else _default(request.url.path)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.stream is not None:
            return StreamingResponse(_written(reply), reply.status, reply.headers,
                                     media_type="text/event-stream")
        if reply.text is not None:
            return Response(reply.text, reply.status, reply.headers, media_type=reply.content_type)
        return JSONResponse(reply.json, reply.status, reply.headers)

    def start(self) -> FakeAPI:
        app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["GET", "POST"])])
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="error", lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake API server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)


@dataclass
class LlamaServer:
    """``python -m llama_cpp.server`` serving the SmolLM2 GGUF on a free loopback port."""

    model_path: Path
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @classmethod
    def start(
        cls, model_path: Path, log: Path, *, n_threads: int = 2, timeout: float = 180.0
    ) -> LlamaServer:
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_threads",
            str(n_threads),
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        server = cls(model_path, port, proc, log)
        server._wait_ready(timeout)
        return server

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"llama_cpp.server exited with {self.proc.returncode}:\n{tail}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as response,
            ):
                if response.status == 200:
                    return
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"llama_cpp.server not ready on port {self.port} after {timeout}s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
