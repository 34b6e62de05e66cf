"""A debate whose participant asks for a security panel as a sub-debate: the scripted models, the
two debates and the event types they use, and where the panel's answer lands in the result."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from debatebus import Debate, Participant
from debatebus.engine._subdebates import SubDebates
from debatebus.llm import LLMRequest
from debatebus.schemas.envelope import Envelope
from debatebus.testing import FunctionLLM

QUESTION = "Ship the login redesign this week?"
ASK = "I need a security view.\nREQUEST_SUB_DEBATE: security"
PANEL_SAYS = "panel says: rotate the session keys first"


class Calls:
    """A FunctionLLM that answers with ``answer`` and counts its calls."""

    def __init__(self, answer: Callable[[LLMRequest], str]) -> None:
        self.calls: list[LLMRequest] = []
        self.answer = answer
        self.llm = FunctionLLM(self._call)

    def _call(self, request: LLMRequest) -> str:
        self.calls.append(request)
        return self.answer(request)


def parent_answer(request: LLMRequest) -> str:
    """alice asks for the security panel when offered, and quotes its conclusion when re-asked."""
    if (request.speaker, request.purpose) == ("alice", "revision"):
        if "concluded:\n" in request.prompt:
            conclusion = request.prompt.split("concluded:\n", 1)[1].split("\n", 1)[0]
            return f"alice revised after the panel: {conclusion}"
        if "REQUEST_SUB_DEBATE: <domain>" in request.prompt:
            return ASK
    return f"{request.speaker} {request.purpose}"


def child_answer(request: LLMRequest) -> str:
    return PANEL_SAYS if request.purpose == "synthesis" else f"{request.speaker} {request.purpose}"


def launch(llm: FunctionLLM, security: str, deadline_s: float = 30.0) -> Debate:
    return Debate("launch", [Participant("alice", "You ship."), Participant("bob", "You test.")],
                  llm=llm, protocol="cross-pollination",
                  sub_debates=SubDebates(domains={"security": security}, deadline_s=deadline_s))


def security_panel(llm: FunctionLLM) -> Debate:
    return Debate("security", [Participant("auditor", "You audit."),
                               Participant("attacker", "You attack.")],
                  llm=llm, protocol="cross-pollination")


def types() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"debate:launch:{tag}", f"debate:security:{tag}"


def revision_of(result: Envelope, speaker: str) -> str:
    (revision,) = [r for r in result.payload["debateTranscript"] if r["phase"] == "revision"]
    return next(t["text"] for t in revision["turns"] if t["speaker"] == speaker)
