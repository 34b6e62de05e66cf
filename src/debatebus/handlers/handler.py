"""``debate.as_handler()``: a debate as an async ``handler(payload) -> dict``, with or without a bus."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from debatebus.engine.result import DebateResult
from debatebus.engine.run import OnEvent
from debatebus.handlers.inputs import (
    DEFAULT_MAX_INPUT_BYTES,
    read_debate_id,
    read_max_rounds,
    read_topic,
)
from debatebus.schemas.results import result_fields

if TYPE_CHECKING:
    from debatebus.engine.debate import Debate

__all__ = ["DebateHandler"]


class DebateHandler:
    """Reads ``payload["input"]`` as the topic, runs the debate, returns the payload merged with the
    ``debate*`` result fields. Raises ``InputError`` for a malformed payload; never raises for a
    failed debate (``debateStatus`` says ``"failed"``)."""

    def __init__(self, debate: Debate, *, max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES) -> None:
        self.debate = debate
        self.max_input_bytes = max_input_bytes

    @property
    def name(self) -> str:
        return self.debate.name

    async def __call__(
        self,
        payload: Mapping[str, Any],
        *,
        request_id: str | None = None,
        on_event: OnEvent | None = None,
    ) -> dict[str, Any]:
        topic = read_topic(payload, self.max_input_bytes)
        max_rounds = read_max_rounds(payload, self.debate.spec.max_rounds)
        debate_id = read_debate_id(payload) or request_id or uuid.uuid4().hex
        result = await self.run(topic, debate_id, max_rounds, request_id, on_event)
        return {**payload, **result_fields(result)}

    async def run(
        self,
        topic: str,
        debate_id: str,
        max_rounds: int | None,
        request_id: str | None,
        on_event: OnEvent | None,
    ) -> DebateResult:
        return await self.debate.run(
            topic, debate_id=debate_id, max_rounds=max_rounds, on_event=on_event,
            request_id=request_id,
        )
