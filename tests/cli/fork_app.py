"""An app for ``debatebus fork`` tests: a four-round debate on ``debate:request`` whose model
counts its calls in ``CALLS`` (this process's)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from debatebus import Debate, DebateBus, Judge, Participant
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM

CALLS: Counter[tuple[str, int, str]] = Counter()


def _answer(request: LLMRequest) -> Any:
    CALLS[request.purpose, request.round, request.speaker] += 1
    if request.purpose == "judge":
        return {"consensus": False, "summary": f"round {request.round}"}
    return f"{request.speaker} in round {request.round}"


debate = Debate("billing", [Participant("optimist", "For."), Participant("critic", "Against.")],
                llm=FunctionLLM(_answer), judge=Judge(), max_rounds=4)
app = DebateBus("memory://")
app.subscribe("debate:request", debate.as_handler())
