"""The debate the group-commit tests run: a model that records its calls and, when asked to,
waits on each one (so the debate's commits are written behind it)."""

from __future__ import annotations

import asyncio
from typing import Any

from debatebus import Debate, Judge, Participant
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM


def llm(calls: list[str], *, wait: bool) -> FunctionLLM:
    async def answer(request: LLMRequest) -> Any:
        calls.append(f"{request.purpose}:{request.round}:{request.speaker}")
        if wait:
            await asyncio.sleep(0.001)  # a model call the debate waits on
        if request.purpose == "judge":
            return {"consensus": False, "summary": "go on"}
        return f"{request.speaker} argues"

    return FunctionLLM(answer, model="fn")


def debate(model: FunctionLLM, rounds: int = 3) -> Debate:
    return Debate("gc", [Participant("a", "For."), Participant("b", "Against.")], llm=model,
                  moderator=Participant("mod", "Moderate."), judge=Judge(), max_rounds=rounds)
