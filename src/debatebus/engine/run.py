"""One debate in progress: its state (transcript so far, usage, counters) and the primitives that
change it: emit an event, count a call and what it spent, commit framing and rounds.
The steps a protocol takes over a run are in ``steps``; decisions over values in ``rules``."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from debatebus.engine.definition import DebateSpec, Judge, Participant, fixed_fields
from debatebus.engine.result import DebateState, Progress
from debatebus.engine.rules import check_budget, latest_verdict, stop_reached
from debatebus.engine.templates import (
    PromptContext,
    fill_parts,
    fill_template,
    names_persona,
    template_fields,
)
from debatebus.engine.transcript import Round, Turn, render_round
from debatebus.exceptions import LLMError
from debatebus.llm.base import LLMRequest
from debatebus.schemas import events as ev
from debatebus.schemas.usage import ZERO_USAGE, TokenUsage

__all__ = ["EventTypes", "OnCommit", "OnEvent", "OnText", "Run", "TurnKey", "TurnText"]

OnEvent = Callable[[ev.DebateEvent], Awaitable[None] | None]
#: The kinds of event an ``OnEvent`` takes: the run builds no other. None: every kind.
EventTypes = frozenset[type[ev.DebateEvent]] | None
OnCommit = Callable[[Progress, Turn | Round], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class TurnKey:
    """Which turn a text is written for: its round (0: the framing), speaker and purpose
    (``opening``, ``framing``, ``synthesis``…)."""

    round: int
    speaker: str
    purpose: str


class TurnText(Protocol):
    """Where the text of one turn goes while the model writes it (``OnText``).

    ``write`` gets each piece of the model's answer as it arrives, raw (the transcript keeps it
    cleaned: cut where another speaker starts, within the phase's word limit); ``commit`` gets
    the turn's text as the transcript keeps it ("" for a failed turn), before the turn is
    reported, and ends it; ``discard`` ends it without a text of its own (the debate stopped
    there, or the turn is asked again: the new answer comes to a new ``TurnText``). Only the
    first of ``commit`` and ``discard`` counts."""

    def write(self, piece: str) -> None: ...

    async def commit(self, text: str) -> None: ...

    def discard(self) -> None: ...


#: Given to a run, it streams its free-text calls (turns, framing, synthesis; a judge's
#: structured answer is never streamed): each call's answer goes to the ``TurnText`` this
#: returns for its turn, as the model writes it.
OnText = Callable[[TurnKey], TurnText]


class Run:
    """The state of one run. Everything spent is counted here, whatever happens to the run.

    Thousands of runs may be in flight in one worker, each waiting on a model call: a run keeps
    its own state only (the transcript once, as turns; prompts are rendered from it per call),
    and reads everything its debate fixes from the spec."""

    __slots__ = ("debate_id", "event_types", "max_rounds", "on_commit", "on_event", "on_text",
                 "progress", "question", "request_id", "resumed_from", "seq", "spec", "started")

    def __init__(
        self,
        spec: DebateSpec,
        question: str,
        debate_id: str,
        *,
        on_event: OnEvent | None = None,
        on_commit: OnCommit | None = None,
        resume: Progress | None = None,
        request_id: str | None = None,
        max_rounds: int | None = None,
        event_types: EventTypes = None,
        on_text: OnText | None = None,
    ) -> None:
        self.spec = spec
        self.question = question
        self.debate_id = debate_id
        self.request_id = request_id
        self.on_event = on_event
        self.event_types = event_types
        self.on_commit = on_commit
        self.on_text = on_text
        self.progress = (
            Progress(resume.framing, list(resume.rounds), resume.usage, resume.calls)
            if resume
            else Progress()
        )
        self.resumed_from = len(self.progress.rounds)
        self.max_rounds = min(spec.max_rounds, max_rounds) if max_rounds else spec.max_rounds
        self.seq = 0
        self.started = time.perf_counter()

    # ---- events -------------------------------------------------------------------------------

    def wants(self, event_type: type[ev.DebateEvent]) -> bool:
        """Whether anyone takes ``event_type``: a step whose event costs something to build
        (a verdict's dump) asks first."""
        return self.on_event is not None and (
            self.event_types is None or event_type in self.event_types)

    async def emit(self, event_type: type[Any], **fields: Any) -> None:
        on_event = self.on_event
        if on_event is None or not self.wants(event_type):
            return
        self.seq += 1
        event = event_type(
            debate_id=self.debate_id, seq=self.seq, request_id=self.request_id, **fields
        )
        handled = on_event(event)
        if inspect.isawaitable(handled):
            await handled

    # ---- calls --------------------------------------------------------------------------------

    def count_call(self, request: LLMRequest) -> None:
        """Before a model call: BudgetExceededError when the budget leaves no room for
        ``request``, else the call is counted. (The steps await the model themselves, with no
        coroutine of the run's in between: one frame fewer per debate in flight.)"""
        if self.spec.budget is not None:
            check_budget(self.spec.budget, self.progress.calls, self.progress.usage, request)
        self.progress.calls += 1

    def spend(self, usage: TokenUsage | None) -> TokenUsage:
        """Count what a call spent (a response's usage, or a failed call's, when known)."""
        if usage is None:
            return ZERO_USAGE
        self.progress.usage += usage
        return usage

    def spend_failed(self, exc: BaseException) -> TokenUsage:
        """Count what a failed call spent: an LLMError may say (else nothing is known)."""
        return self.spend(exc.usage if isinstance(exc, LLMError) else None)

    # ---- prompts ------------------------------------------------------------------------------

    def prompt(self, phase: str, who: str, number: int, transcript: str = "", **extra: str) -> str:
        """``phase``'s prompt for ``who``: a string template filled with the debate's fields, or a
        callable given a PromptContext (with the DebateState)."""
        spec = self.spec
        template = spec.templates.get(phase)
        if callable(template):
            return template(self.context(who, number, phase, transcript, **extra))
        values = template_fields(question=self.question, framing=self.framing_field(),
                                 round=number, transcript=transcript, **extra)
        bound = spec.bound_templates.get((phase, who))
        if bound is not None:  # the fields the debate fixes are in it already
            return fill_parts(bound, values, template)
        return fill_template(template, {**values, **fixed_fields(spec, phase, who)})

    def framing_field(self) -> str:
        """The ``{framing}`` of prompts: the committed framing, labelled, or nothing."""
        framing = self.progress.framing
        return f"{self.spec.lang.framing_label}{framing.text}\n" if framing else ""

    def system_for(self, phase: str, who: Participant | Judge) -> str:
        """The system prompt of ``who``'s ``phase`` call: the debate's shared one (in its language)
        when the template places the persona itself (the shipped ones do), else ``who``'s own."""
        if names_persona(self.spec.templates.get(phase)):
            return self.spec.lang.system
        return who.system_prompt

    def context(
        self, who: str, number: int, phase: str, transcript: str = "", **extra: Any
    ) -> PromptContext:
        return PromptContext(
            question=self.question,
            debate_name=self.spec.name,
            speaker=who,
            round=number,
            framing=self.framing_field(),
            transcript=transcript,
            participants=self.spec.participant_names,
            word_limit=self.spec.word_limit_texts.get(phase, ""),
            persona=self.spec.personas.get(who, ""),
            state=self.state(number),
            **extra,
        )

    def full_transcript(self, pending: str | None = None) -> str:
        """Every committed round, plus a pending round's rendering; what judge and synthesis see.
        Rendered from the turns at each call, not kept: a run holds its transcript once."""
        parts = [render_round(r) for r in self.progress.rounds]
        if pending is not None:
            parts.append(pending)
        return "\n\n".join(parts)

    def state(self, number: int) -> DebateState:
        rounds = self.progress.rounds
        framing = self.progress.framing.text if self.progress.framing else None
        return DebateState(
            self.debate_id,
            self.question,
            number,
            tuple(rounds),
            framing,
            latest_verdict(rounds),
            self.progress.usage,
            self.progress.calls,
        )

    # ---- commits ------------------------------------------------------------------------------

    async def commit_framing(self, turn: Turn) -> None:
        self.progress.framing = turn
        if self.on_commit is not None:
            await self.on_commit(self.progress, turn)

    async def commit_round(self, rnd: Round) -> None:
        """Append a finished round and checkpoint it."""
        self.progress.rounds.append(rnd)
        if self.on_commit is not None:
            await self.on_commit(self.progress, rnd)

    def stop_reached(self, number: int) -> bool:
        """The debate's stop rule, after round ``number``."""
        return stop_reached(self.spec, self.progress.rounds, lambda: self.state(number))
