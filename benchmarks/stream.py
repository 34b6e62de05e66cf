"""What streaming turns costs: a worker's CPU per token with ``stream_turns=True`` against the same
debates unstreamed, side by side in one run, and how long a token takes from the provider to a
subscriber of ``debate:events``.

    python benchmarks/stream.py [--rounds 5] [--debates 16] [--tokens 200] [--token-ms 10]

A fake OpenAI-compatible provider runs in its own process on loopback: every answer is
``--tokens`` tokens written ``--token-ms`` apart (server-sent events when the call streams; else
the whole answer once that long has passed). Each token is the microsecond it was written, so a
subscriber knows how old every token it reads is. Three debatebus workers (their own processes) serve
the same debate (3 participants × 2 rounds, durable, events published) on a private Redis:

- ``unstreamed``: the handler as it was; each turn is one HTTP call, answered whole;
- ``provider stream``: the same, but each call reads the provider's stream (no deltas): what the
  SDK's streaming costs by itself;
- ``streamed``: ``as_handler(stream_turns=True)``: the turns are read as streams and published
  as ``turn_delta`` events, at 100 ms ticks at most (the provider read at the same ticks).

Each round runs ``--debates`` debates at once on each worker in turn (alternating, so the machine's
noise falls on all three); CPU per token is the worker's user + system time (``/proc``) over the
completion tokens its debates reported. Reported: per-round figures, medians and ranges.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("unstreamed", "provider stream", "streamed")
LOG = Path(os.environ.get("BENCH_LOG", "/tmp/debatebus-bench-stream.log"))


# ---- the fake provider (its own process) ----------------------------------------------------------


def provider_app(tokens: int, token_s: float) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    usage = {"prompt_tokens": 100, "completion_tokens": tokens, "total_tokens": 100 + tokens}
    head = '{"id":"c","object":"chat.completion.chunk","created":0,"model":"fake","choices":'

    def chunk(content: str) -> bytes:
        return (f'data: {head}[{{"index":0,"delta":{{"content":"{content}"}},'
                f'"finish_reason":null}}]}}\n\n').encode()

    async def written() -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        yield chunk("")
        for i in range(tokens):
            # On schedule, not after a sleep each: the same length as an answer sent whole.
            await asyncio.sleep(max(0.0, start + (i + 1) * token_s - loop.time()))
            yield chunk(f" {time.time_ns() // 1000}")  # the moment the token leaves
        yield f'data: {head}[],"usage":{json.dumps(usage)}}}\n\n'.encode()
        yield b"data: [DONE]\n\n"

    async def completions(request: Request) -> Response:
        body = await request.json()
        if body.get("stream"):
            return StreamingResponse(written(), media_type="text/event-stream")
        await asyncio.sleep(tokens * token_s)
        text = " ".join(str(time.time_ns() // 1000) for _ in range(tokens))
        return JSONResponse({"id": "c", "object": "chat.completion", "created": 0,
                             "model": "fake", "usage": usage, "choices": [{
                                 "index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}]})

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def serve_provider(port: int, tokens: int, token_s: float) -> None:
    import uvicorn

    uvicorn.run(provider_app(tokens, token_s), host="127.0.0.1", port=port, log_level="error",
                access_log=False)


# ---- the workers (their own processes) ------------------------------------------------------------


def worker_app() -> Any:
    """``debatebus worker benchmarks.stream:worker_app``, configured by ``STREAM_BENCH_*``."""
    from debatebus import Debate, Participant
    from debatebus._worker import DebateBus
    from debatebus.llm import LLM, LLMRequest, LLMResponse
    from debatebus.llm._openai_compat import OpenAICompatibleLLM

    mode = os.environ["STREAM_BENCH_MODE"]
    provider = OpenAICompatibleLLM("fake", base_url=os.environ["STREAM_BENCH_PROVIDER"],
                                   timeout=120, total_timeout=240)

    class ReadsTheStream(LLM):
        """``complete`` by reading the provider's stream: what streaming costs with no delta."""

        model = "fake"

        async def complete(self, request: LLMRequest) -> LLMResponse:
            async with provider.stream(request) as stream:
                async for _ in stream:
                    pass
            assert stream.response is not None
            return stream.response

    llm = ReadsTheStream() if mode == "provider stream" else provider
    debate = Debate("stream-bench", [Participant(n, f"Argue as the {n}.") for n in
                                     ("optimist", "critic", "pragmatist")],
                    llm=llm, max_rounds=2)
    app = DebateBus(os.environ["STREAM_BENCH_BROKER"], publish_events=True,
                    events_topic=os.environ["STREAM_BENCH_EVENTS"], concurrency=64,
                    group=f"bench-{uuid.uuid4().hex[:6]}")
    app.subscribe(os.environ["STREAM_BENCH_EVENT_TYPE"],
                  debate.as_handler(stream_turns=mode == "streamed"))
    return app


# ---- the driver -----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # Logs to a file: a pipe nobody reads fills up and blocks a chatty process.
    return subprocess.Popen([sys.executable, *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                (str(ROOT / "src"), str(ROOT))), **env},
                            stdout=LOG.open("ab"), stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Watch:
    """The deltas a subscriber of the events topic reads: each token's age when it arrives."""

    def __init__(self) -> None:
        self.ages_ms: list[float] = []
        self.deltas = 0
        self.events = 0

    async def follow(self, deliveries: AsyncIterator[Any]) -> None:
        from debatebus.schemas.events import BUS_EVENT_DECODER, TurnDelta

        async for delivery in deliveries:
            now_us = time.time_ns() // 1000
            event = BUS_EVENT_DECODER.decode(delivery.body)
            self.events += 1
            if isinstance(event, TurnDelta):
                self.deltas += 1
                self.ages_ms.extend((now_us - int(token)) / 1000 for token in event.text.split())


async def batch(client: Any, event_type: str, debates: int, worker_pid: int,
                tag: str) -> tuple[float, int, float]:
    """``debates`` debates at once: the worker's CPU seconds, the completion tokens they
    reported, and the wall time."""
    results = await client.results(event_type)
    ids = {f"{tag}-{i}" for i in range(debates)}
    cpu0, t0 = cpu_seconds(worker_pid), time.perf_counter()
    for rid in sorted(ids):
        await client.publish(event_type, {"input": f"Should we ship {rid}?"}, request_id=rid)
    tokens = 0
    async with asyncio.timeout(600):
        async for envelope in results:
            if envelope.request_id in ids:
                ids.discard(envelope.request_id)
                payload = envelope.payload
                assert payload["debateStatus"] == "completed", payload.get("debateError")
                tokens += payload["debateTokenUsage"]["completionTokens"]
                if not ids:
                    break
    elapsed = time.perf_counter() - t0
    await results.aclose()
    return cpu_seconds(worker_pid) - cpu0, tokens, elapsed


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--debates", type=int, default=16, help="debates at once per batch")
    parser.add_argument("--tokens", type=int, default=200, help="tokens per answer")
    parser.add_argument("--token-ms", type=float, default=10.0, help="ms between two tokens")
    args = parser.parse_args()

    from tests.support.servers import RedisServer, free_port

    from debatebus.client import BusClient

    redis = RedisServer.start()
    port = free_port()
    provider = start([__file__, "--serve-provider", str(port), str(args.tokens),
                      str(args.token_ms / 1000)], {})
    events_topic = f"bench:events:{uuid.uuid4().hex[:6]}"
    workers: dict[str, subprocess.Popen[bytes]] = {}
    event_types = {mode: f"bench:{mode.replace(' ', '-')}:{uuid.uuid4().hex[:6]}"
                   for mode in MODES}
    try:
        for mode in MODES:
            workers[mode] = start(["-m", "debatebus", "worker", "benchmarks.stream:worker_app",
                                   "--log-level", "WARNING"], {
                "STREAM_BENCH_MODE": mode, "STREAM_BENCH_BROKER": redis.url,
                "STREAM_BENCH_PROVIDER": f"http://127.0.0.1:{port}/v1",
                "STREAM_BENCH_EVENTS": events_topic, "STREAM_BENCH_EVENT_TYPE": event_types[mode]})
        figures: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
        ages: list[float] = []
        deltas = events = 0
        async with BusClient(redis.url) as client:
            watch = Watch()
            watching = asyncio.create_task(
                watch.follow(await client.transport.subscribe([events_topic])))
            for mode in MODES:  # warm up: connections, imports, the first debates
                await batch(client, event_types[mode], 2, workers[mode].pid, f"warm-{mode}")
            for number in range(1, args.rounds + 1):
                line = []
                order = MODES if number % 2 else tuple(reversed(MODES))
                for mode in order:
                    watch.ages_ms, watch.deltas, watch.events = [], 0, 0
                    cpu, tokens, elapsed = await batch(client, event_types[mode], args.debates,
                                                       workers[mode].pid, f"r{number}")
                    per_token = 1e6 * cpu / tokens
                    figures[mode].append((per_token, elapsed))
                    line.append(f"{mode} {per_token:.1f} µs/token ({elapsed:.1f} s)")
                    if mode == "streamed":
                        await asyncio.sleep(0.5)  # the last deltas reach the watcher
                        ages.extend(watch.ages_ms)
                        deltas += watch.deltas
                        events += watch.events
                print(f"round {number}: " + "; ".join(line), flush=True)
            watching.cancel()
    finally:
        for proc in workers.values():
            stop(proc)
        stop(provider)
        redis.stop()

    per_token = {mode: [f for f, _ in figures[mode]] for mode in MODES}
    print(f"\n{args.debates} debates at once, 6 turns of {args.tokens} tokens "
          f"{args.token_ms:g} ms apart; worker CPU per completion token, median (range):")
    for mode in MODES:
        print(f"  {mode:<16} {spread(per_token[mode])} µs")
    paired = [100 * (s / u - 1) for s, u in zip(per_token["streamed"], per_token["unstreamed"],
                                                strict=True)]
    sdk = [100 * (p / u - 1) for p, u in zip(per_token["provider stream"],
                                             per_token["unstreamed"], strict=True)]
    bus = [100 * (s / p - 1) for s, p in zip(per_token["streamed"], per_token["provider stream"],
                                              strict=True)]
    print(f"  streamed vs unstreamed, per round:        {spread(paired)} % more CPU (goal ≤ 10 %)")
    print(f"  of which reading the provider's stream:   {spread(sdk)} % (provider stream vs "
          "unstreamed)")
    print(f"  and publishing the deltas:                {spread(bus)} % (streamed vs provider "
          "stream)")
    ages.sort()
    turns = args.rounds * args.debates * 6
    print(f"token → subscriber over {len(ages):,} tokens: p50 {statistics.median(ages):.1f} ms, "
          f"p99 {ages[int(len(ages) * 0.99) - 1]:.1f} ms, max {ages[-1]:.1f} ms (goal ≤ 150 ms)")
    print(f"deltas: {deltas:,} for {turns:,} streamed turns ({deltas / turns:.1f} a turn of "
          f"{args.tokens * args.token_ms / 1000:.1f} s); events topic: {events:,} messages")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--serve-provider":
        serve_provider(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    else:
        asyncio.run(main())
