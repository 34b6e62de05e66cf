"""The public ``Debate``: a validated definition you can run, or serve on a bus as a handler."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from debatebus.engine.cross_pollination import run_cross_pollination
from debatebus.engine.definition import Budget, DebateSpec, Judge, Participant, Until, build_spec
from debatebus.engine.fingerprint import definition_hash
from debatebus.engine.prompts import Prompts
from debatebus.engine.result import DebateResult, Progress
from debatebus.engine.round_robin import run_round_robin
from debatebus.engine.run import DebateFailure, OnCommit, OnEvent, Run
from debatebus.exceptions import ConfigError
from debatebus.handlers.durable import DEFAULT_STORE_OUTAGE_S
from debatebus.handlers.inputs import DEFAULT_MAX_INPUT_BYTES
from debatebus.llm.base import LLM
from debatebus.schemas import events as ev

if TYPE_CHECKING:
    from debatebus.checkpoints.base import CheckpointStore
    from debatebus.handlers.handler import DebateHandler

__all__ = ["Debate"]

_PROTOCOLS = {"round-robin": run_round_robin, "cross-pollination": run_cross_pollination}


class Debate:
    """A multi-agent debate definition. Validated on construction; immutable; safe to share."""

    def __init__(
        self,
        name: str,
        participants: Sequence[Participant],
        *,
        llm: LLM | None = None,
        moderator: Participant | None = None,
        judge: Judge | None = None,
        synthesizer: Participant | None = None,
        protocol: str = "round-robin",
        max_rounds: int = 3,
        until: Until | None = None,
        transcript_window: int | None = None,
        failure_policy: str = "degrade",
        prompts: Prompts | None = None,
        word_limits: Mapping[str, int] | None = None,
        audience: str | None = None,
        budget: Budget | None = None,
        deadline_s: float | None = None,
        drift: str = "strict",
    ) -> None:
        if drift not in ("strict", "loose"):
            raise ConfigError(f"unknown drift {drift!r}: use 'strict' or 'loose'")
        self.drift = drift
        self.spec: DebateSpec = build_spec(
            name,
            participants,
            llm=llm,
            moderator=moderator,
            judge=judge,
            synthesizer=synthesizer,
            protocol=protocol,
            max_rounds=max_rounds,
            until=until,
            transcript_window=transcript_window,
            failure_policy=failure_policy,
            prompts=prompts,
            word_limits=word_limits,
            audience=audience,
            budget=budget,
            deadline_s=deadline_s,
        )

    @property
    def name(self) -> str:
        return self.spec.name

    @functools.cached_property
    def definition_hash(self) -> str:
        """Stable hash of the definition; checkpoints record it to detect drift on resume."""
        return definition_hash(self.spec)

    def __repr__(self) -> str:
        names = [p.name for p in self.spec.participants]
        return f"Debate({self.spec.name!r}, {names}, protocol={self.spec.protocol!r})"

    async def run(
        self,
        topic: str,
        *,
        debate_id: str | None = None,
        on_event: OnEvent | None = None,
        max_rounds: int | None = None,
        resume: Progress | None = None,
        on_commit: OnCommit | None = None,
        request_id: str | None = None,
    ) -> DebateResult:
        """Run the debate to its end. Never raises for model failures: a failed debate returns
        ``status="failed"`` with its partial transcript and every token spent."""
        if not isinstance(topic, str):
            raise ConfigError(f"topic must be a string, got {type(topic).__name__}")
        if max_rounds is not None and max_rounds < 1:
            raise ConfigError(f"max_rounds must be ≥ 1, got {max_rounds}")
        run = Run(
            self.spec,
            topic,
            debate_id or uuid.uuid4().hex,
            on_event=on_event,
            on_commit=on_commit,
            resume=resume,
            request_id=request_id,
            max_rounds=max_rounds,
        )
        await run.emit(
            ev.DebateStarted,
            topic=topic,
            debate_name=self.spec.name,
            protocol=self.spec.protocol,
            participants=[p.name for p in self.spec.participants],
            max_rounds=run.max_rounds,
            resumed_from_round=run.resumed_from,
        )
        return await run.finish(await self._drive(run))

    async def _drive(self, run: Run) -> str | None:
        """Play the protocol; the error text when the debate fails, None when it completes."""
        protocol = _PROTOCOLS[self.spec.protocol]
        try:
            if self.spec.deadline_s is None:
                await protocol(run)
            else:
                async with asyncio.timeout(self.spec.deadline_s):
                    await protocol(run)
        except DebateFailure as failure:
            return str(failure)
        except TimeoutError:
            return f"debate {self.spec.name!r} exceeded its deadline of {self.spec.deadline_s} s"
        return None

    def as_handler(
        self,
        *,
        store: CheckpointStore | None = None,
        durable: bool = True,
        lease_ttl_s: float = 30.0,
        store_outage_s: float = DEFAULT_STORE_OUTAGE_S,
        owner: str | None = None,
        max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
    ) -> DebateHandler:
        """An async ``handler(payload) -> dict`` for a bus (or a direct call); see handlers.

        Durable by default: with ``store``, or, when served by ``DebateBus`` without one, with a
        store chosen from the broker URL (Redis → the same Redis; ``memory://`` → in memory;
        Kafka → none, with a warning). A direct call without ``store`` keeps no checkpoints.
        ``durable=False`` turns checkpoints off. ``store_outage_s`` is how long a debate in
        flight waits for its store to come back; ``lease_ttl_s`` is how long a dead worker's
        debate stays locked; ``owner`` names this worker in leases."""
        from debatebus.handlers.handler import DebateHandler

        return DebateHandler(self, store=store, durable=durable, lease_ttl_s=lease_ttl_s,
                             store_outage_s=store_outage_s,
                             owner=owner,
                             max_input_bytes=max_input_bytes)
