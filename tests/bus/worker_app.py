"""A worker app for subprocess tests, configured by environment variables.

Every LLM call is appended to ``DBB_CALLS_LOG`` (one JSON line: debate question, purpose, round,
speaker, pid) so tests can count the calls each debate cost across worker processes.

Knobs: ``DBB_BROKER``, ``DBB_EVENT_TYPE`` (required); ``DBB_GROUP``, ``DBB_CONCURRENCY``,
``DBB_DRAIN_TIMEOUT``, ``DBB_CLAIM_IDLE_MS``, ``DBB_DELAY`` (seconds per call),
``DBB_ROUNDS``, ``DBB_JUDGE``, ``DBB_MAX_DELIVERIES``, ``DBB_PUBLISH_EVENTS=1``; ``DBB_STORE`` (an
explicit checkpoint store URL, with ``DBB_LEASE_TTL``; without it the handler is the default one
that ``DebateBus`` makes durable); ``DBB_MODEL`` (a model string for ``resolve_llm`` instead of the
logged FunctionLLM). An input containing ``HUGE_RESULT`` makes every speaker answer
``DBB_HUGE_BYTES`` (default 1.2 MB) of text, so the result is too large for the broker.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from debatebus import Debate, FunctionLLM, Judge, LLMRequest, Participant
from debatebus.worker import DebateBus

DEBATE_IDS: dict[str, str] = {}


def _log_call(request: LLMRequest) -> None:
    path = os.environ.get("DBB_CALLS_LOG")
    if path:
        line = json.dumps({"question": request.prompt.split("\n", 1)[0], "purpose": request.purpose,
                           "round": request.round, "speaker": request.speaker, "pid": os.getpid()})
        with open(path, "a") as f:  # one short write per line: O_APPEND keeps lines whole
            f.write(line + "\n")


HUGE_MARKER = "HUGE_RESULT"


async def _answer(request: LLMRequest) -> Any:
    _log_call(request)
    await asyncio.sleep(float(os.environ.get("DBB_DELAY", "0")))
    if request.purpose == "judge":
        return {"consensus": False, "summary": f"round {request.round}"}
    if HUGE_MARKER in request.prompt.split("\n", 1)[0]:
        return "x" * int(os.environ.get("DBB_HUGE_BYTES", "1200000"))
    return f"{request.speaker} in round {request.round}"


def _llm() -> Any:
    model = os.environ.get("DBB_MODEL")
    if model:
        from debatebus.llm import resolve_llm

        return resolve_llm(model)
    return FunctionLLM(_answer)


def build_debate() -> Debate:
    return Debate(
        "process-debate",
        [Participant("optimist", "For."), Participant("critic", "Against.")],
        llm=_llm(),
        moderator=Participant("moderator", "Moderate."),
        judge=Judge() if os.environ.get("DBB_JUDGE", "1") == "1" else None,
        max_rounds=int(os.environ.get("DBB_ROUNDS", "2")),
    )


def _transport_options(url: str) -> dict[str, Any]:
    if url.startswith("kafka://"):
        return {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}
    if url.startswith(("redis://", "rediss://")):
        return {"claim_idle_ms": int(os.environ.get("DBB_CLAIM_IDLE_MS", "1500")), "block_ms": 200}
    return {}


def app() -> DebateBus:
    url = os.environ["DBB_BROKER"]
    bus = DebateBus(
        url,
        group=os.environ.get("DBB_GROUP", "debatebus"),
        concurrency=int(os.environ.get("DBB_CONCURRENCY", "8")),
        drain_timeout=float(os.environ.get("DBB_DRAIN_TIMEOUT", "30")),
        max_deliveries=int(os.environ.get("DBB_MAX_DELIVERIES", "5")),
        publish_events=os.environ.get("DBB_PUBLISH_EVENTS") == "1",
        transport_options=_transport_options(url),
    )
    options: dict[str, Any] = {}
    store_url = os.environ.get("DBB_STORE")
    if store_url:
        from debatebus.checkpoints import store_from_url

        options["store"] = store_from_url(store_url)
        options["lease_ttl_s"] = float(os.environ.get("DBB_LEASE_TTL", "2"))
    bus.subscribe(os.environ["DBB_EVENT_TYPE"], build_debate().as_handler(**options))
    return bus
