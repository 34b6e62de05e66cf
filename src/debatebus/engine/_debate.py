"""The public ``Debate``: a validated definition you can run, or serve on a bus as a handler."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from debatebus.engine._cross_pollination import run_cross_pollination
from debatebus.engine._definition import DebateSpec
from debatebus.engine._fingerprint import definition_hash
from debatebus.engine._outcome import Outcome
from debatebus.engine._people import PeopleRunner
from debatebus.engine._presets import preset
from debatebus.engine._result import DebateResult, Progress, Status
from debatebus.engine._round_robin import run_round_robin
from debatebus.engine._rules import DebateFailure
from debatebus.engine._run import EventTypes, OnCommit, OnEvent, OnText, Run
from debatebus.engine._steps import emit_phi, finish, synthesize
from debatebus.engine._subdebates import ChildRunner, InProcessChildren, SubDebateSession
from debatebus.engine._transcript import Turn
from debatebus.exceptions import ConfigError
from debatebus.llm._base import LLM
from debatebus.schemas import events as ev

#: What a run without ``deadline_s`` runs within: shared, not a timeout object per run.
_NO_DEADLINE = contextlib.nullcontext()

#: What ``Debate.as_handler`` calls: ``(debate, **options) -> a bus handler``.
HandlerFactory = Callable[..., Any]
#: The factory ``debatebus.handlers`` registers when it is imported (``import debatebus`` imports
#: it): the handlers build on the engine, so the engine never imports them.
_handler_factory: list[HandlerFactory] = []


def serve_debates_with(factory: HandlerFactory) -> None:
    """Make ``factory`` what ``Debate.as_handler`` returns a handler from (``debatebus.handlers``
    registers ``DebateHandler``; a later call replaces it)."""
    _handler_factory[:] = [factory]



@dataclass(frozen=True, slots=True)
class DebateMetrics:
    """What ``on_metrics`` receives once per run, completed or failed; the bus publishes the same
    figures in the result (``debatePhiHat``, ``debateAgents``, ``debateDurationMs``)."""

    debate_id: str
    debate_name: str
    status: Status
    phi_hat: float | None
    #: The participants with at least one turn that did not fail, in the order they first spoke.
    agents: tuple[str, ...]
    duration_ms: float

    @classmethod
    def of(cls, result: DebateResult) -> DebateMetrics:
        spoke = (
            turn.speaker
            for rnd in result.rounds
            if rnd.phase != "audience"  # the audience round models the audience, not a debater
            for turn in rnd.turns
            if not turn.failed
        )
        return cls(result.debate_id, result.debate_name, result.status, result.phi_hat,
                   tuple(dict.fromkeys(spoke)), result.duration_ms)


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

    @classmethod
    def from_preset(cls, preset_name: str, /, *, llm: LLM | None = None,
                    **overrides: Any) -> Debate:
        """A ready panel from ``debatebus.engine._presets`` (e.g. ``"starter_trio"``) on ``llm``;
        ``overrides`` are any other ``Debate`` arguments (``name``, ``language``…)."""
        return cls(**preset(preset_name).arguments(llm, overrides))

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
        children: ChildRunner | None = None,
        depth: int = 0,
        event_types: EventTypes = None,
        people: PeopleRunner | None = None,
        on_text: OnText | None = None,
    ) -> DebateResult:
        """Run the debate to its end. Never raises for model failures: a failed debate returns
        ``status="failed"`` with its partial transcript and every token spent.

        With ``sub_debates``, ``children`` runs the sub-debates a position asks for (default: in
        this process, ``InProcessChildren``; a bus handler passes one that publishes them);
        ``depth`` is this run's own (0 at the top; a sub-debate's events carry it).
        ``event_types``: the kinds of event ``on_event`` takes (None: all); no other is built.
        ``people`` asks the people (``HumanParticipant``) for their turns: a bus handler passes
        one that publishes turn requests; without one their turns fail (docs/people.md).
        ``on_text`` streams each free-text call (turns, framing, synthesis) as the model writes
        it, to the ``TurnText`` it gives for the call's ``TurnKey`` (``debatebus.engine._run``;
        sub-debates run in this process are not streamed)."""
        run, session = self._start(question, debate_id, on_event, max_rounds, resume, on_commit,
                                   request_id, children, depth, event_types, people, on_text)
        await self._announce(run)
        # Played here, within the deadline, not in a coroutine of its own (one frame fewer per
        # debate in flight). A DebateFailure or the deadline ends the run failed, keeping what
        # the protocol had decided (its Φ̂).
        outcome: Outcome | None = None
        synthesis: Turn | None = None
        failure: DebateFailure | None = None
        try:
            deadline = _NO_DEADLINE if self.deadline_s is None else asyncio.timeout(self.deadline_s)
            async with deadline:
                if self.protocol == "cross-pollination":
                    outcome = await run_cross_pollination(run, session)
                else:
                    outcome = await run_round_robin(run)
                await emit_phi(run, outcome.phi_hat)
                if outcome.synthesis is not None:
                    synthesis = await synthesize(run, outcome.synthesis)
        except DebateFailure as failed:
            failure = failed
        except TimeoutError:
            failure = DebateFailure(f"debate {self.name!r} exceeded its deadline of "
                                    f"{self.deadline_s} s")
        result = await finish(run, outcome, synthesis, failure)
        await self._report(result)
        return result

    async def _announce(self, run: Run) -> None:
        await run.emit(
            ev.DebateStarted,
            question=run.question,
            debate_name=self.name,
            protocol=self.protocol,
            participants=[p.name for p in self.participants],
            max_rounds=run.max_rounds,
            resumed_from_round=run.resumed_from,
        )

    async def _report(self, result: DebateResult) -> None:
        """Hand ``on_metrics``, if any, the run's metrics."""
        if self.on_metrics is not None:
            reported = self.on_metrics(DebateMetrics.of(result))
            if inspect.isawaitable(reported):
                await reported

    def _start(self, question: str, debate_id: str | None, on_event: OnEvent | None,
               max_rounds: int | None, resume: Progress | None, on_commit: OnCommit | None,
               request_id: str | None, children: ChildRunner | None,
               depth: int, event_types: EventTypes,
               people: PeopleRunner | None,
               on_text: OnText | None) -> tuple[Run, SubDebateSession | None]:
        """``run``'s arguments, checked: the new run and its sub-debate session, if any."""
        if not isinstance(question, str):
            raise ConfigError(f"the question must be a string, got {type(question).__name__}")
        if max_rounds is not None and max_rounds < 1:
            raise ConfigError(f"max_rounds must be ≥ 1, got {max_rounds}")
        if depth and on_event is not None:
            on_event = _at_depth(on_event, depth)
        run = Run(
            self,
            question,
            debate_id or uuid.uuid4().hex,
            on_event=on_event,
            on_commit=on_commit,
            resume=resume,
            request_id=request_id,
            max_rounds=max_rounds,
            event_types=event_types,
            people=people,
            on_text=on_text,
        )
        if self.sub_debates is None:
            return run, None
        runner = children or InProcessChildren(self, on_event)
        return run, SubDebateSession(run, self.sub_debates, runner, depth)

    def as_handler(self, **options: Any) -> Any:
        """This debate as a bus handler, a ``debatebus.handlers.DebateHandler`` (or an async
        ``handler(payload) -> dict`` to call directly), durable by default. ``options`` are
        ``DebateHandler``'s (``HandlerOptions``), documented there: ``store``, ``durable``,
        ``lease_ttl_s``, ``store_outage_s``, ``owner``, ``max_input_bytes``, ``drift``,
        ``presets`` (the ``debatebus.engine._presets`` a request may pick with
        ``payload.preset``), ``retention_s``, ``input_field``, ``stream_turns`` and
        ``stream_interval_s`` (each turn's text published while it is written:
        docs/streaming.md)."""
        if not _handler_factory:
            raise ConfigError("no handler factory is registered: import debatebus (or "
                              "debatebus.handlers), which registers DebateHandler")
        return _handler_factory[0](self, **options)


def _at_depth(on_event: OnEvent, depth: int) -> OnEvent:
    """``on_event``, given each event marked with the sub-debate ``depth`` it comes from."""

    def marked(event: ev.DebateEvent) -> Awaitable[None] | None:
        event.depth = depth
        return on_event(event)

    return marked
