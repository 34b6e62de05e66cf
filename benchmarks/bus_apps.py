"""Worker processes for benchmarks/bus.py: debatebus, FastStream and raw-client baselines.

Every worker runs the same instant debate (3 participants × 3 rounds, judge, moderator) as
benchmarks/overhead.py, except the raw baselines, which echo the request as the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import Any

from debatebus import Debate, Judge, Participant
from debatebus.engine import Verdict
from debatebus.handlers._results import result_fields
from debatebus.llm import LLMRequest, LLMResponse, TokenUsage

REQUESTS = os.environ.get("BENCH_REQUESTS", "bench:request")
RESULTS = f"event:{REQUESTS}:completed"
USAGE = TokenUsage(12, 8, 20)


class InstantLLM:
    """Answers at once: a fixed text, or a fixed non-consensus verdict for the judge."""

    model = "instant"
    _text = LLMResponse("An instant, well-argued position.", None, USAGE, "instant")
    _verdict = LLMResponse('{"consensus": false}', Verdict(consensus=False, summary="go on"),
                           USAGE, "instant")

    async def complete(self, request: LLMRequest) -> LLMResponse:
        return self._verdict if request.response_schema is not None else self._text


class WaitingLLM(InstantLLM):
    """As instant, but each call waits (for nothing) as a real model call does: that is when a
    durable debate's commits are written (group commit), so with it every commit costs what it
    does in production."""

    async def complete(self, request: LLMRequest) -> LLMResponse:
        await asyncio.sleep(0)
        return await super().complete(request)


def instant_debate(*, waits: bool = False) -> Debate:
    return Debate(
        "bench-debate",
        [Participant(n, f"You are {n}.") for n in ("optimist", "critic", "pragmatist")],
        llm=WaitingLLM() if waits else InstantLLM(),
        moderator=Participant("moderator", "Moderate."), judge=Judge(),
        max_rounds=3,
    )


def debatebus_app() -> Any:
    """``debatebus worker benchmarks.bus_apps:debatebus_app`` — env BENCH_BROKER; BENCH_STORE
    names an explicit store, BENCH_DURABLE=0 turns durability off; neither: the default handler
    (durable, with the store the bus derives from its broker URL). BENCH_LLM_WAITS=1: each model
    call waits, as a real one does (``WaitingLLM``)."""
    from debatebus._worker import DebateBus

    url = os.environ["BENCH_BROKER"]
    options: dict[str, Any] = {}
    if os.environ.get("BENCH_DURABLE") == "0":
        options["durable"] = False
    elif os.environ.get("BENCH_STORE"):
        from debatebus.checkpoints import store_from_url

        store = os.environ["BENCH_STORE"]
        options["store"] = store_from_url(store, **({"prefix": "bench"} if "redis" in store else {}))
    # Tansu answers a fetch only when its wait expires, never when data arrives: wait little.
    transport = {"fetch_max_wait_ms": 5} if url.startswith("kafka://") else {}
    # 64 debates at once: as many as the driver keeps in flight, so the worker is never idle with
    # requests waiting (with 16, a durable debate's store round trips would idle it).
    bus = DebateBus(url, concurrency=int(os.environ.get("BENCH_CONCURRENCY", "64")),
                    transport_options=transport)
    debate = instant_debate(waits=os.environ.get("BENCH_LLM_WAITS") == "1")
    bus.subscribe(REQUESTS, debate.as_handler(**options))
    return bus


async def faststream_worker(url: str, workers: int) -> None:
    from faststream import FastStream
    from faststream.redis import RedisBroker, StreamSub

    broker = RedisBroker(url)
    debate = instant_debate()
    publisher = broker.publisher(stream=RESULTS)

    @broker.subscriber(stream=StreamSub(REQUESTS, group="fs", consumer="c1"), max_workers=workers)
    @publisher
    async def handle(body: dict[str, Any]) -> dict[str, Any]:
        payload = body["payload"]
        result = await debate.run(payload["input"])
        return {"requestId": body["requestId"], "payload": {**payload, **result_fields(result)}}

    await FastStream(broker).run()


async def raw_redis_worker(url: str) -> None:
    """XREADGROUP a batch, then XADD each body as its result and XACK, pipelined per batch."""
    import redis.asyncio as redis

    client = redis.Redis.from_url(url)
    with contextlib.suppress(redis.ResponseError):  # the group exists already
        await client.xgroup_create(REQUESTS, "raw", id="0", mkstream=True)
    while True:
        reply = await client.xreadgroup("raw", "c1", {REQUESTS: ">"}, count=64, block=100)
        for _, entries in reply or []:
            pipe = client.pipeline(transaction=True)
            for _, fields in entries:
                pipe.xadd(RESULTS, {b"envelope": fields[b"envelope"]})
            pipe.xack(REQUESTS, "raw", *[e for e, _ in entries])
            await pipe.execute()


async def raw_kafka_worker(bootstrap: str) -> None:
    """Consume in a group, produce each value as its result, commit after each batch."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    name = REQUESTS.replace(":", ".")
    consumer = AIOKafkaConsumer(name, bootstrap_servers=bootstrap, group_id="raw",
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                fetch_max_wait_ms=5)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False)
    await consumer.start()
    await producer.start()
    while True:
        batches = await consumer.getmany(timeout_ms=100, max_records=256)
        sends = [await producer.send(RESULTS.replace(":", "."), r.value, key=r.key)
                 for records in batches.values() for r in records]
        for fut in sends:
            await fut
        if batches:
            await consumer.commit()


def main() -> None:
    kind, target = sys.argv[1], sys.argv[2]
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    if kind == "faststream":
        runner(faststream_worker(target, int(sys.argv[3]) if len(sys.argv) > 3 else 1))
    elif kind == "raw-redis":
        runner(raw_redis_worker(target))
    elif kind == "raw-kafka":
        runner(raw_kafka_worker(target))
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")


if __name__ == "__main__":
    main()
