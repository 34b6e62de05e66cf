"""The debate the FastStream host tests serve, its scripted model, and a request body."""

from __future__ import annotations

import json
from typing import Any

from debatebus import Debate, Judge, Participant
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM


def counting_llm() -> FunctionLLM:
    def answer(request: LLMRequest) -> Any:
        if request.purpose == "judge":
            return {"consensus": True, "summary": "agreed"}
        return f"{request.speaker}: a view"

    return FunctionLLM(answer)


def debate(llm: FunctionLLM) -> Debate:
    return Debate("fs", [Participant("pro", "For."), Participant("con", "Against.")], llm=llm,
                  moderator=Participant("mod", "Moderate."), judge=Judge(), max_rounds=2)


def request(request_id: str, **payload: Any) -> bytes:
    return json.dumps({"requestId": request_id, "payload": payload}).encode()
