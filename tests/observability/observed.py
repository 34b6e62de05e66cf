"""Helpers for the observability tests: a scripted debate, a store that fails once, probes."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from tests.support.bus import make_debate, transport_options

from debatebus._worker import DebateBus
from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.checkpoints._base import Counters
from debatebus.llm import LLMRequest
from debatebus.observability._observer import Observer, RequestContext
from debatebus.schemas.events import DebateEvent
from debatebus.testing import FunctionLLM
from debatebus.transports import Delivery

__all__ = ["DOOMED", "FAKE_KEY", "TIMEOUT", "EventLog", "FlakyStore", "app_on", "debatebus_check", "first",
           "new_event_type",
           "scripted_llm"]

TIMEOUT = 60.0
#: Topics containing this make every participant's turn fail (the debate fails in round 1).
DOOMED = "doomed"
FAKE_KEY = "sk-ant-api03-FAKEfakeFAKEfake0123456789"


def new_event_type() -> str:
    return f"debate:request{uuid.uuid4().hex[:8]}"


def scripted_llm() -> FunctionLLM:
    """Consensus at round 2; participants fail on a doomed topic (framing still succeeds). Each
    call waits (for nothing), as a model's does: that is when a durable debate's commits are
    written (group commit), so ``FlakyStore`` sees them."""

    async def answer(request: LLMRequest) -> Any:
        await asyncio.sleep(0)
        if request.purpose == "judge":
            return {"consensus": request.round >= 2, "summary": f"after round {request.round}"}
        if DOOMED in request.prompt and request.purpose not in ("framing", "synthesis"):
            raise RuntimeError(f"401 from the provider: invalid x-api-key {FAKE_KEY}")
        return f"{request.speaker} on round {request.round}: a considered view"

    return FunctionLLM(answer)


class FlakyStore(MemoryCheckpointStore):
    """Fails the commit of round 2 of ``debate_id`` once, as a store outage would: the handler
    raises, the worker leaves the delivery for redelivery, and the next one resumes."""

    def __init__(self, debate_id: str) -> None:
        super().__init__()
        self.debate_id = debate_id
        self.appends = 0
        self.failed = False

    async def append(self, debate_id: str, entry: bytes, counters: Counters) -> int:
        if debate_id.endswith(f"/{self.debate_id}") and not self.failed:  # its key
            self.appends += 1
            if self.appends == 3:  # framing, round 1, round 2
                self.failed = True
                raise RuntimeError("checkpoint store hiccup")
        return await super().append(debate_id, entry, counters)


class EventLog(Observer):
    """Records every debate event the worker reports, and runs ``probe`` on each."""

    def __init__(self, probe: Any = None) -> None:
        self.events: list[DebateEvent] = []
        self.probe = probe

    def debate_event(self, ctx: RequestContext, event: DebateEvent) -> None:
        self.events.append(event)
        if self.probe is not None:
            self.probe(ctx, event)

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def app_on(url: str, event_type: str, observers: Sequence[Observer], **handler_options: Any,
           ) -> DebateBus:
    # A long claim time: a requeued request comes back at once anyway, and nothing is ever
    # reclaimed because a busy 2-core machine stalled a keepalive.
    options = transport_options(url)
    if url.startswith("redis://"):
        options["claim_idle_ms"] = 60_000
    app = DebateBus(url, transport_options=options, observers=observers, heartbeat_interval_s=None)
    app.subscribe(event_type, make_debate(llm=scripted_llm()).as_handler(**handler_options))
    return app


async def first(stream: AsyncIterator[Delivery], timeout: float = TIMEOUT) -> Delivery:
    async with asyncio.timeout(timeout):
        delivery = await anext(stream)
    with contextlib.suppress(Exception):
        await stream.aclose()  # type: ignore[attr-defined]
    return delivery


async def debatebus_check(*args: str) -> tuple[int, str]:
    """``python -m debatebus check …`` without blocking the loop a worker may be running on."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "debatebus", "check", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode().strip()
