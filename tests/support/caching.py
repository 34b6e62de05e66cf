"""Fake Anthropic and OpenAI endpoints that apply each provider's documented prompt-caching rules.

They answer the real SDKs' requests (``AnthropicLLM``, ``OpenAICompatibleLLM`` pointed at them)
and report usage the way the provider would bill it, so a test or benchmark measures what caching
a debate's requests would earn, not what debatebus believes it sent.

Tokens: text is cut into words and punctuation marks, each keeping the whitespace before it, so a
prompt's tokens join back into its exact text (a prefix of tokens is a prefix of bytes) and English
prose comes out at about 1.3 tokens a word. Every message adds 4 tokens of framing (role markers).

Anthropic (Messages API, "Prompt caching" in its documentation):
- a request may mark at most 4 blocks with ``cache_control`` (more: HTTP 400);
- the prefix of a mark is everything up to and including its block (system, then messages);
- it is written to the cache only when at least ``min_tokens`` long (1024 for Claude Sonnet 4.5,
  4096 for Claude Haiku 4.5…): shorter ones are silently not cached;
- a read is the longest cached prefix that ends at a block boundary at a mark or up to 20 blocks
  before it; what lies between the read and the furthest mark written is billed as a cache write
  (``cache_creation_input_tokens``), the read as ``cache_read_input_tokens``, the rest as
  ``input_tokens``;
- an entry lives ``ttl_s`` (5 minutes) from its last use.

OpenAI (Chat Completions, its "Prompt caching" guide):
- every prompt of at least 1024 tokens is cached, automatically; nothing is billed for writing;
- requests are routed by ``prompt_cache_key`` when given (else by their first 256 tokens), and
  a prompt reads the longest prefix it shares with a cached prompt on its route, in steps of 128
  tokens from 1024 on (``usage.prompt_tokens_details.cached_tokens``);
- an entry lives ``ttl_s`` (5 to 10 minutes idle: 5 here) from its last use.

Time is virtual: each request moves the clock by ``seconds_per_call`` (a model's answer time).
"""

from __future__ import annotations

import hashlib
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

__all__ = ["AnthropicCache", "CachingAPI", "OpenAICache", "Usage", "tokens"]

_TOKEN = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")
MESSAGE_TOKENS = 4  # role markers around each message


def tokens(text: str) -> list[str]:
    """``text`` as tokens that join back into it exactly."""
    return _TOKEN.findall(text)


@dataclass
class Usage:
    """What one request was billed for, as the provider reports it."""

    prompt: int
    cache_read: int = 0
    cache_write: int = 0


@dataclass
class _Entry:
    tokens: int
    expires: float


class AnthropicCache:
    """Anthropic's caching rules over linearised requests (see the module's docstring)."""

    def __init__(self, *, min_tokens: int = 1024, ttl_s: float = 300.0, lookback: int = 20,
                 max_breakpoints: int = 4) -> None:
        self.min_tokens = min_tokens
        self.ttl_s = ttl_s
        self.lookback = lookback
        self.max_breakpoints = max_breakpoints
        self._entries: dict[str, _Entry] = {}
        self.breakpoints_seen: list[int] = []  # how many marks each request carried

    @staticmethod
    def _blocks(body: dict[str, Any]) -> list[tuple[str, str, bool]]:
        """(role, text, marked) of every block in order: system, then each message's."""
        out: list[tuple[str, str, bool]] = []

        def add(role: str, content: Any) -> None:
            if isinstance(content, str):
                out.append((role, content, False))
                return
            for block in content:
                out.append((role, block["text"], "cache_control" in block))

        if body.get("system"):
            add("system", body["system"])
        for message in body["messages"]:
            add(message["role"], message["content"])
        return out

    def bill(self, body: dict[str, Any], now: float) -> Usage | str:
        """The request's usage, or why it is refused (HTTP 400)."""
        blocks = self._blocks(body)
        marks = [i for i, (_, _, marked) in enumerate(blocks) if marked]
        self.breakpoints_seen.append(len(marks))
        if len(marks) > self.max_breakpoints:
            return f"A maximum of {self.max_breakpoints} blocks with cache_control may be provided"
        ends, keys = [], []
        total, digest, role = 0, hashlib.sha256(), None
        for block_role, text, _ in blocks:
            if block_role != role:
                total += MESSAGE_TOKENS
                role = block_role
                digest.update(b"\x00role:" + block_role.encode())
            total += len(tokens(text))
            digest.update(b"\x00block:" + text.encode())
            ends.append(total)
            keys.append(digest.copy().hexdigest())
        read = 0
        for mark in marks:
            for i in range(mark, max(mark - self.lookback, 0) - 1, -1):
                entry = self._entries.get(keys[i])
                if entry is not None and entry.expires > now:
                    entry.expires = now + self.ttl_s  # a read refreshes it
                    read = max(read, ends[i])
                    break
        written_to = read
        for mark in marks:
            if ends[mark] >= self.min_tokens and ends[mark] > read:
                self._entries[keys[mark]] = _Entry(ends[mark], now + self.ttl_s)
                written_to = max(written_to, ends[mark])
        return Usage(total, read, written_to - read)


class OpenAICache:
    """OpenAI's automatic caching over tokenised prompts (see the module's docstring)."""

    def __init__(self, *, min_tokens: int = 1024, step: int = 128, ttl_s: float = 300.0,
                 route_tokens: int = 256) -> None:
        self.min_tokens = min_tokens
        self.step = step
        self.ttl_s = ttl_s
        self.route_tokens = route_tokens
        self._routes: dict[str, list[tuple[list[str], list[float]]]] = {}
        self.keys_seen: list[str | None] = []

    @staticmethod
    def _tokens(body: dict[str, Any]) -> list[str]:
        out: list[str] = []
        for message in body["messages"]:
            out += [f"<{message['role']}>"] * MESSAGE_TOKENS
            out += tokens(message["content"])
        return out

    def bill(self, body: dict[str, Any], now: float) -> Usage:
        prompt = self._tokens(body)
        key = body.get("prompt_cache_key")
        self.keys_seen.append(key)
        route = self._routes.setdefault(key or "".join(prompt[: self.route_tokens]), [])
        route[:] = [(cached, expires) for cached, expires in route if expires[0] > now]
        best, best_entry = 0, None
        for cached, expires in route:
            shared = _common_prefix(prompt, cached)
            if shared > best:
                best, best_entry = shared, expires
        hit = best // self.step * self.step if best >= self.min_tokens else 0
        if hit and best_entry is not None:
            best_entry[0] = now + self.ttl_s
        if len(prompt) >= self.min_tokens:
            route.append((prompt, [now + self.ttl_s]))
        return Usage(len(prompt), hit)


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


Answer = Callable[[str, dict[str, Any]], str]
"""Writes the reply to a request: (the API: "anthropic" or "openai", the request body) → text."""


@dataclass
class CachingAPI:
    """Both endpoints on one loopback port, in a background thread: ``/v1/messages`` under
    ``anthropic``'s rules, ``/v1/chat/completions`` under ``openai``'s. ``billed`` lists every
    request's usage, in order."""

    answer: Answer
    anthropic: AnthropicCache = field(default_factory=AnthropicCache)
    openai: OpenAICache = field(default_factory=OpenAICache)
    seconds_per_call: float = 10.0
    billed: list[Usage] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    now: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _messages(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.bodies.append(body)
        self.now += self.seconds_per_call
        usage = self.anthropic.bill(body, self.now)
        if isinstance(usage, str):
            return JSONResponse({"type": "error", "error": {
                "type": "invalid_request_error", "message": usage}}, 400)
        self.billed.append(usage)
        text = self.answer("anthropic", body)
        return JSONResponse({
            "id": f"msg_{len(self.billed)}", "type": "message", "role": "assistant",
            "model": body["model"], "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": usage.prompt - usage.cache_read - usage.cache_write,
                      "cache_read_input_tokens": usage.cache_read,
                      "cache_creation_input_tokens": usage.cache_write,
                      "output_tokens": len(tokens(text))}})

    async def _chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.bodies.append(body)
        self.now += self.seconds_per_call
        usage = self.openai.bill(body, self.now)
        self.billed.append(usage)
        text = self.answer("openai", body)
        answer = len(tokens(text))
        return JSONResponse({
            "id": f"chatcmpl-{len(self.billed)}", "object": "chat.completion", "created": 0,
            "model": body["model"], "choices": [{"index": 0, "finish_reason": "stop",
                                                 "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": usage.prompt, "completion_tokens": answer,
                      "total_tokens": usage.prompt + answer,
                      "prompt_tokens_details": {"cached_tokens": usage.cache_read}}})

    def start(self) -> CachingAPI:
        app = Starlette(routes=[Route("/v1/messages", self._messages, methods=["POST"]),
                                Route("/v1/chat/completions", self._chat, methods=["POST"])])
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="error", lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the caching API did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
