"""``Debate.as_handler`` builds what the handlers package registered: the engine never imports it."""

from __future__ import annotations

from typing import Any

from debatebus import Debate, Participant
from debatebus.engine._debate import serve_debates_with
from debatebus.handlers import DebateHandler
from debatebus.testing import FunctionLLM


def test_as_handler_calls_the_registered_factory() -> None:
    debate = Debate("f", [Participant("a", "A."), Participant("b", "B.")],
                    llm=FunctionLLM(lambda request: "x"))
    assert isinstance(debate.as_handler(durable=False), DebateHandler)
    made: list[tuple[Debate, dict[str, Any]]] = []

    def factory(made_for: Debate, **options: Any) -> str:
        made.append((made_for, options))
        return "a handler"

    serve_debates_with(factory)
    try:
        assert debate.as_handler(durable=False) == "a handler"
    finally:
        serve_debates_with(DebateHandler)
    assert made == [(debate, {"durable": False})]
    assert isinstance(debate.as_handler(durable=False), DebateHandler)
