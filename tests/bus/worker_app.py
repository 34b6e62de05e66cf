"""A worker app for subprocess tests, configured by environment variables.

Every LLM call is appended to ``DBB_CALLS_LOG`` (one JSON line: debate question, purpose, round,
speaker, pid) so tests can count the calls each debate cost across worker processes.

Knobs: ``DBB_BROKER``, ``DBB_EVENT_TYPE`` (required); ``DBB_GROUP``, ``DBB_CONCURRENCY``,
``DBB_DRAIN_TIMEOUT``, ``DBB_CLAIM_IDLE_MS``, ``DBB_DELAY`` (seconds per call),
``DBB_ROUNDS``, ``DBB_JUDGE``, ``DBB_MAX_DELIVERIES``, ``DBB_PUBLISH_EVENTS=1`` (on
``DBB_EVENTS_TOPIC``, default ``debate:events``); ``DBB_STORE`` (an
explicit checkpoint store URL; without it the handler is the default one that ``DebateBus``
makes durable); ``DBB_LEASE_TTL`` (seconds; 2 with ``DBB_STORE``, else the handler's default);
``DBB_MODEL`` (a model string for ``resolve_llm`` instead of the logged FunctionLLM);
``DBB_HEARTBEAT_INTERVAL`` (seconds between heartbeats, default the worker's);
``DBB_STREAM_TURNS=1`` streams turns (``stream_turns=True``); ``DBB_WORDS`` adds that many words
to each free-text answer, and ``DBB_STREAM_PAUSE`` is the seconds between the words of a streamed
one. An input
containing ``HUGE_RESULT`` makes every speaker answer ``DBB_HUGE_BYTES`` (default 1.2 MB) of
text, so the result is too large for the broker.

Sub-debates: ``DBB_PROTOCOL`` (e.g. ``cross-pollination``); ``DBB_SUB_DEBATES=<domain>=<event
type>`` gives the debate that domain on the bus (``DBB_SUB_DEADLINE`` seconds, default 60), and
the optimist then asks for it in round 1b and, re-asked, quotes the panel's conclusion;
``DBB_SYNTHESIS`` is the text every synthesis call answers (a child worker's panel conclusion).

People: ``DBB_PERSON=<name>=<event type>`` seats a ``HumanParticipant`` between the optimist and
the critic (``DBB_PERSON_DEADLINE`` seconds, default 60).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from debatebus import Debate, Judge, Participant
from debatebus._worker import DebateBus
from debatebus.engine import HumanParticipant
from debatebus.engine._subdebates import SubDebates
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM

DEBATE_IDS: dict[str, str] = {}


def _log_call(request: LLMRequest) -> None:
    path = os.environ.get("DBB_CALLS_LOG")
    if path:
        line = json.dumps({"question": request.prompt.split("\n", 1)[0], "purpose": request.purpose,
                           "round": request.round, "speaker": request.speaker, "pid": os.getpid()})
        with open(path, "a") as f:  # one short write per line: O_APPEND keeps lines whole
            f.write(line + "\n")


HUGE_MARKER = "HUGE_RESULT"
#: What the optimist says when it has read a panel's conclusion: this, then the conclusion.
REVISED_AFTER_PANEL = "optimist revised after the panel: "


def _sub_debate_answer(request: LLMRequest) -> str | None:
    """The optimist's 1b answer when sub-debates are configured: ask when offered, quote the
    conclusion when re-asked; None for any other call."""
    domains = os.environ.get("DBB_SUB_DEBATES")
    if not domains or (request.speaker, request.purpose) != ("optimist", "revision"):
        return None
    if "concluded:\n" in request.prompt:
        return REVISED_AFTER_PANEL + request.prompt.split("concluded:\n", 1)[1].split("\n", 1)[0]
    if "REQUEST_SUB_DEBATE: <domain>" in request.prompt:
        return "optimist needs specialists\nREQUEST_SUB_DEBATE: " + domains.split("=", 1)[0]
    return None


async def _answer(request: LLMRequest) -> Any:
    _log_call(request)
    await asyncio.sleep(float(os.environ.get("DBB_DELAY", "0")))
    if request.purpose == "judge":
        return {"consensus": False, "summary": f"round {request.round}"}
    if HUGE_MARKER in request.prompt.split("\n", 1)[0]:
        return "x" * int(os.environ.get("DBB_HUGE_BYTES", "1200000"))
    if request.purpose == "synthesis" and os.environ.get("DBB_SYNTHESIS"):
        return os.environ["DBB_SYNTHESIS"]
    asked = _sub_debate_answer(request)
    if asked is not None:
        return asked
    words = int(os.environ.get("DBB_WORDS", "0"))
    if words:
        return f"{request.speaker} in round {request.round}: " + " ".join(
            f"w{i}" for i in range(words))
    return f"{request.speaker} in round {request.round}"


def _llm() -> Any:
    model = os.environ.get("DBB_MODEL")
    if model:
        from debatebus.llm import resolve_llm

        return resolve_llm(model)
    return FunctionLLM(_answer, stream_pause_s=float(os.environ.get("DBB_STREAM_PAUSE", "0")))


def build_debate() -> Debate:
    return Debate(
        "process-debate",
        [Participant("optimist", "For."), *_person(), Participant("critic", "Against.")],
        llm=_llm(),
        moderator=Participant("moderator", "Moderate."),
        judge=Judge() if os.environ.get("DBB_JUDGE", "1") == "1" else None,
        max_rounds=int(os.environ.get("DBB_ROUNDS", "2")),
        protocol=os.environ.get("DBB_PROTOCOL", "round-robin"),
        sub_debates=_sub_debates(),
    )


def _person() -> list[Participant]:
    spec = os.environ.get("DBB_PERSON")
    if not spec:
        return []
    name, event_type = spec.split("=", 1)
    return [HumanParticipant(name, event_type=event_type,
                             deadline_s=float(os.environ.get("DBB_PERSON_DEADLINE", "60")))]


def _sub_debates() -> SubDebates | None:
    spec = os.environ.get("DBB_SUB_DEBATES")
    if not spec:
        return None
    domain, event_type = spec.split("=", 1)
    return SubDebates(domains={domain: event_type},
                      deadline_s=float(os.environ.get("DBB_SUB_DEADLINE", "60")))


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
        events_topic=os.environ.get("DBB_EVENTS_TOPIC", "debate:events"),
        transport_options=_transport_options(url),
        heartbeat_interval_s=float(os.environ.get("DBB_HEARTBEAT_INTERVAL", "5")),
    )
    options: dict[str, Any] = {}
    store_url = os.environ.get("DBB_STORE")
    if store_url:
        from debatebus.checkpoints import store_from_url

        options["store"] = store_from_url(store_url)
    lease_ttl = os.environ.get("DBB_LEASE_TTL", "2" if store_url else "")
    if lease_ttl:
        options["lease_ttl_s"] = float(lease_ttl)
    if os.environ.get("DBB_STREAM_TURNS") == "1":
        options["stream_turns"] = True
    bus.subscribe(os.environ["DBB_EVENT_TYPE"], build_debate().as_handler(**options))
    return bus
