"""``debate.as_handler()``: a debate as an async ``handler(payload) -> dict``, with or without a bus."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from debatebus.checkpoints.base import CheckpointStore
from debatebus.engine.run import OnEvent
from debatebus.handlers.durable import DurableRunner
from debatebus.handlers.inputs import (
    DEFAULT_MAX_INPUT_BYTES,
    read_debate_id,
    read_max_rounds,
    read_replay,
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

    def __init__(
        self,
        debate: Debate,
        *,
        store: CheckpointStore | None = None,
        lease_ttl_s: float = 30.0,
        owner: str | None = None,
        max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
    ) -> None:
        self.debate = debate
        self.store = store
        self.max_input_bytes = max_input_bytes
        self.durable = (
            DurableRunner(debate, store, owner=owner, lease_ttl_s=lease_ttl_s) if store else None
        )

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
        if read_replay(payload) == "rerun":
            debate_id = f"{debate_id}~rerun-{uuid.uuid4().hex[:8]}"
        if self.durable is not None:
            fields = await self.durable.run(topic, debate_id, max_rounds, request_id, on_event)
            return {**payload, **fields}
        result = await self.debate.run(
            topic, debate_id=debate_id, max_rounds=max_rounds, on_event=on_event,
            request_id=request_id,
        )
        return {**payload, **result_fields(result)}
