"""A durable debate for tests: a model that counts its calls and can crash at call N, the debate
it serves, and how many calls that debate needs."""

from __future__ import annotations

from typing import Any

from debatebus import Debate, Judge, Participant
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM


class Crash(BaseException):
    """A worker dying mid-call: not an Exception, so no failure policy catches it."""


class CountingLLM:
    """Answers instantly, counts calls per (purpose, round, speaker), and can crash at call N."""

    model = "counting"

    def __init__(self, crash_at: int | None = None, crash_on: str | None = None) -> None:
        self.calls: list[tuple[str, int, str]] = []
        self.crash_at = crash_at
        self.crash_on = crash_on
        self.fn = FunctionLLM(self._answer, model="counting")

    def _answer(self, request: LLMRequest) -> Any:
        if self.crash_at is not None and len(self.calls) + 1 == self.crash_at:
            raise Crash(f"crash at call {self.crash_at}")
        if self.crash_on is not None and request.purpose == self.crash_on:
            raise Crash(f"crash on {self.crash_on}")
        self.calls.append((request.purpose, request.round, request.speaker))
        if request.purpose == "judge":
            return {"consensus": False, "summary": f"round {request.round}"}
        return f"{request.speaker} says something in round {request.round}"

    async def complete(self, request: LLMRequest) -> Any:
        return await self.fn.complete(request)


def debate(llm: Any, *, rounds: int = 3, system: str = "For.", **options: Any) -> Debate:
    return Debate("durable", [Participant("a", system), Participant("b", "Against.")], llm=llm,
                  moderator=Participant("mod", "Moderate."), judge=Judge(), max_rounds=rounds,
                  **options)


# one framing + per round (2 turns + 1 judge) + one synthesis
def needed_calls(rounds: int) -> int:
    return 1 + 3 * rounds + 1
