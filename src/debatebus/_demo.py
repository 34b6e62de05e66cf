"""The demo debate: three participants, a moderator and a judge, served on a bus.

``debatebus demo`` runs it in one process; ``debatebus worker debatebus._demo:app`` serves it on
``$DEBATEBUS_BROKER`` (default ``redis://localhost:6379/0``) with ``$DEBATEBUS_LLM`` (default: the
embedded local model).
"""

from __future__ import annotations

from debatebus._worker import DEFAULT_GROUP, DebateBus
from debatebus.engine import Debate, Judge, Participant
from debatebus.engine._definition import Protocol
from debatebus.llm._base import LLM
from debatebus.llm._registry import resolve_llm
from debatebus.transports import broker_url

#: Where ``debatebus demo`` asks and answers, so that it never consumes or answers real traffic on
#: a shared broker (``debatebus worker debatebus._demo:app`` serves ``debate:request`` on purpose).
DEMO_EVENT_TYPE = "debatebus:demo:request"
DEMO_GROUP = "debatebus-demo"

# Short turns keep a small model on topic (and a 3 × 2 debate with a judge fast): each limit is
# asked for in the prompt and enforced by the call's token budget.
DEMO_WORD_LIMITS = {"framing": 60, "opening": 60, "rebuttal": 60, "synthesis": 100}
#: The rounds played before the judge may stop the demo: everyone opens, then everyone rebuts
#: (a debate a judge ended after the openings had no debate in it).
DEMO_MIN_ROUNDS = 2


def build_debate(llm: LLM, *, judge: bool = True, rounds: int = 2,
                 protocol: Protocol = "round-robin") -> Debate:
    participants = [
        Participant("optimist", "You argue for the proposal. Be concrete and brief."),
        Participant("critic", "You argue against the proposal. Name concrete risks. Be brief."),
        Participant("pragmatist", "You look for the workable middle ground. Be brief."),
    ]
    moderator = Participant("moderator", "You moderate debates neutrally and concisely.")
    return Debate(
        "demo-debate",
        participants,
        llm=llm,
        moderator=moderator,
        judge=Judge() if judge else None,
        protocol=protocol,
        max_rounds=rounds,
        min_rounds=min(DEMO_MIN_ROUNDS, rounds),
        word_limits=DEMO_WORD_LIMITS,
    )


def serve(debate: Debate, broker: str | None = None, *, event_type: str = "debate:request",
          group: str = DEFAULT_GROUP) -> DebateBus:
    """A worker app answering ``event_type`` with ``debate``, in consumer group ``group``."""
    bus = DebateBus(broker_url(broker), group=group)
    bus.subscribe(event_type, debate.as_handler())
    return bus


def build_app(broker: str | None = None, *, llm_spec: str | None = None) -> DebateBus:
    return serve(build_debate(resolve_llm(llm_spec)), broker)


def app() -> DebateBus:
    """Factory for ``debatebus worker debatebus._demo:app`` (built when the worker starts)."""
    return build_app()
