"""Redis restarted without persistence under running debates: the worker says what was lost, the
debates it was running still answer (their results marked, since their requests are gone), no
model call is repeated, and new requests flow."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import Counter
from typing import Any

import pytest
import redis
from tests.support.bus import running
from tests.support.quiet import settled_redis_group
from tests.support.servers import RedisServer

from debatebus import Debate, Judge, Participant
from debatebus._worker import DebateBus
from debatebus.client import request_message
from debatebus.llm import LLMRequest
from debatebus.schemas.envelope import completed_topic
from debatebus.testing import FunctionLLM
from debatebus.transports._base import RECOVERED_HEADER

pytestmark = [pytest.mark.redis, pytest.mark.slow]

IN_FLIGHT = 4
CALLS_PER_DEBATE = 1 + 3 * 2 + 1  # framing, 2 rounds of 2 turns and a verdict, the synthesis


class Model:
    """Round 2 waits for ``go``; counts calls per question."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.in_round_2: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    async def __call__(self, request: LLMRequest) -> Any:
        question = request.prompt.split("Q-", 1)[1].split(" ", 1)[0] if "Q-" in request.prompt \
            else "?"
        self.calls[question] += 1
        if request.round == 2:
            self.in_round_2[question] += 1
            await self.go.wait()
        await asyncio.sleep(0)  # a model call waits: the commits are written meanwhile
        if request.purpose == "judge":
            return {"consensus": False, "summary": f"round {request.round}: split"}
        return f"{request.speaker} on Q-{question} round {request.round}"


def results_of(server: RedisServer, event_type: str) -> list[tuple[dict[str, Any], dict[str, str]]]:
    with redis.Redis(host="127.0.0.1", port=server.port) as client:
        entries = client.xrange(completed_topic(event_type))
    return [(json.loads(fields[b"envelope"])["payload"],
             json.loads(fields.get(b"headers", b"{}"))) for _, fields in entries]


def publish(server: RedisServer, event_type: str, question: str, request_id: str) -> None:
    message = request_message(event_type, {"input": f"Q-{question} adopt it?"},
                              request_id=request_id)
    with redis.Redis(host="127.0.0.1", port=server.port) as client:
        client.xadd(event_type, {"envelope": message.body, "key": request_id})


async def wait_until(check: Any, timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.05)):  # the broker's state, polled: nothing to await on
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not reached within {timeout} s")


async def test_redis_restarted_empty_mid_flow(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="debatebus")
    server = RedisServer.start(appendonly=False)
    event_type = f"debate:empty{uuid.uuid4().hex[:6]}"
    model = Model()
    debate = Debate("restart", [Participant("a", "For."), Participant("b", "Against.")],
                    llm=FunctionLLM(model), moderator=Participant("mod", "Moderate."),
                    judge=Judge(), max_rounds=2)
    app = DebateBus(server.url, heartbeat_interval_s=None, concurrency=8,
                    transport_options={"claim_idle_ms": 2000, "block_ms": 100})
    app.subscribe(event_type, debate.as_handler(lease_ttl_s=1.0))
    try:
        async with running(app):
            for n in range(IN_FLIGHT):
                publish(server, event_type, f"old{n}", f"old-{n}")
            await wait_until(lambda: len(model.in_round_2) == IN_FLIGHT)
            await asyncio.to_thread(server.restart)  # empty: no AOF, no RDB
            await asyncio.sleep(1.5)  # the leases' next renewals find them gone
            model.go.set()
            await wait_until(lambda: len(results_of(server, event_type)) >= IN_FLIGHT)
            publish(server, event_type, "new", "new-1")
            await wait_until(lambda: len(results_of(server, event_type)) >= IN_FLIGHT + 1)
            # Every request on the stream delivered and acked: none can run again (the old
            # debates' results are all in, so none of their tasks is still running either).
            await settled_redis_group(server.url, event_type, app.group)
            results = results_of(server, event_type)
    finally:
        server.stop()
    by_request = Counter(payload["debateId"] for payload, _ in results)
    assert by_request == Counter({**{f"old-{n}": 1 for n in range(IN_FLIGHT)}, "new-1": 1})
    for payload, headers in results:
        assert payload["debateStatus"] == "completed", payload["debateError"]
        recovered = headers.get(RECOVERED_HEADER)
        assert recovered == ("request-lost" if payload["debateId"].startswith("old") else None)
    # No model call repeated: every debate paid exactly its calls.
    assert all(count == CALLS_PER_DEBATE for count in model.calls.values()), model.calls
    said = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "was gone from Redis before it was settled" in said
    assert "had lapsed with nobody holding it" in said
