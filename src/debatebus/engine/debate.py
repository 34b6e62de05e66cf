"""The public ``Debate``: a validated definition you can run, or serve on a bus as a handler."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Unpack

from debatebus.engine.cross_pollination import run_cross_pollination
from debatebus.engine.definition import DebateSpec, Protocol
from debatebus.engine.fingerprint import definition_hash
from debatebus.engine.outcome import Outcome
from debatebus.engine.result import DebateResult, Progress
from debatebus.engine.round_robin import run_round_robin
from debatebus.engine.rules import DebateFailure
from debatebus.engine.run import OnCommit, OnEvent, Run
from debatebus.engine.steps import emit_phi, finish, synthesize
from debatebus.engine.transcript import Turn
from debatebus.exceptions import ConfigError
from debatebus.schemas import events as ev

if TYPE_CHECKING:
    from debatebus.handlers.handler import DebateHandler, HandlerOptions

__all__ = ["Debate"]

_PROTOCOLS: dict[Protocol, Callable[[Run], Awaitable[Outcome]]] = {
    "round-robin": run_round_robin,
    "cross-pollination": run_cross_pollination,
}


class Debate(DebateSpec):
    """A multi-agent debate definition. Validated on construction; immutable; safe to share.

    Its arguments are the fields of ``DebateSpec``, declared there only."""

    @property
    def spec(self) -> DebateSpec:
        """The definition the engine reads: this debate itself."""
        return self

    @functools.cached_property
    def definition_hash(self) -> str:
        """Stable hash of the definition; checkpoints record it to detect drift on resume."""
        return definition_hash(self)

    def __repr__(self) -> str:
        names = [p.name for p in self.participants]
        return f"Debate({self.name!r}, {names}, protocol={self.protocol!r})"

    async def run(
        self,
        question: str,
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
        if not isinstance(question, str):
            raise ConfigError(f"the question must be a string, got {type(question).__name__}")
        if max_rounds is not None and max_rounds < 1:
            raise ConfigError(f"max_rounds must be ≥ 1, got {max_rounds}")
        run = Run(
            self,
            question,
            debate_id or uuid.uuid4().hex,
            on_event=on_event,
            on_commit=on_commit,
            resume=resume,
            request_id=request_id,
            max_rounds=max_rounds,
        )
        await run.emit(
            ev.DebateStarted,
            question=question,
            debate_name=self.name,
            protocol=self.protocol,
            participants=[p.name for p in self.participants],
            max_rounds=run.max_rounds,
            resumed_from_round=run.resumed_from,
        )
        return await self._play(run)

    async def _play(self, run: Run) -> DebateResult:
        """Play the protocol, then its synthesis, within the deadline. A DebateFailure or the
        deadline ends the run failed, keeping what the protocol had decided (its Φ̂)."""
        outcome: Outcome | None = None
        synthesis: Turn | None = None
        error: str | None = None
        try:
            async with asyncio.timeout(self.deadline_s):
                outcome = await _PROTOCOLS[self.protocol](run)
                await emit_phi(run, outcome.phi_hat)
                if outcome.synthesis is not None:
                    synthesis = await synthesize(run, outcome.synthesis)
        except DebateFailure as failure:
            error = str(failure)
        except TimeoutError:
            error = f"debate {self.name!r} exceeded its deadline of {self.deadline_s} s"
        return await finish(run, outcome, synthesis, error)

    def as_handler(self, **options: Unpack[HandlerOptions]) -> DebateHandler:
        """This debate as a bus handler (or an async ``handler(payload) -> dict`` to call
        directly), durable by default. ``options`` are ``DebateHandler``'s, documented there:
        ``store``, ``durable``, ``lease_ttl_s``, ``store_outage_s``, ``owner``,
        ``max_input_bytes``, ``drift``."""
        # Imported here: the handlers build on the engine, not the other way round.
        from debatebus.handlers.handler import DebateHandler

        return DebateHandler(self, **options)
