"""One debate in progress: its state (transcript so far, usage, counters) and the primitives that
change it: emit an event, count a call and what it spent, commit framing and rounds.
The steps a protocol takes over a run are in ``steps``; decisions over values in ``rules``."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from debatebus._usage import ZERO_USAGE, TokenUsage
from debatebus.engine._definition import DebateSpec, Judge, Participant, fixed_fields
from debatebus.engine._people import NoPeople, PeopleRunner, PlayedTurn
from debatebus.engine._result import DebateState, Progress
from debatebus.engine._rules import check_budget, latest_verdict, spent_cost, stop_reached
from debatebus.engine._templates import (
    PromptContext,
    fill_parts,
    fill_template,
    names_persona,
    template_fields,
)
from debatebus.engine._transcript import (
    NO_TRANSCRIPT,
    Round,
    TranscriptText,
    Turn,
    render_transcript,
)
from debatebus.exceptions import LLMError
from debatebus.llm._base import LLMRequest, Message
from debatebus.schemas import events as ev

OnEvent = Callable[[ev.DebateEvent], Awaitable[None] | None]
#: The kinds of event an ``OnEvent`` takes: the run builds no other. None: every kind.
EventTypes = frozenset[type[ev.DebateEvent]] | None
_NO_PEOPLE = NoPeople()
#: The ``asked`` of every run without people: never written to (only people are asked).
_NO_ASKS: dict[tuple[str, int], int] = {}
#: Commits the framing (a ``Turn``), a round, or (debates with people) a turn as it ends.
OnCommit = Callable[[Progress, Turn | Round | PlayedTurn], Awaitable[None]]


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
    first of ``commit`` and ``discard`` counts. ``interval_s``: how often it takes pieces at
    most (``LLM.stream``'s; 0, as they come)."""

    @property
    def interval_s(self) -> float: ...

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

    __slots__ = ("asked", "debate_id", "event_types", "max_rounds", "on_commit", "on_event",
                 "on_text", "people", "progress", "question", "request_id", "resumed_from", "seq",
                 "spec", "started", "unmetered")

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
        people: PeopleRunner | None = None,
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
            Progress(resume.framing, list(resume.rounds), resume.usage, resume.calls,
                     list(resume.sub_debates), by_speaker=dict(resume.by_speaker),
                     turns=resume.turns, people=resume.people)
            if resume
            else Progress()
        )
        #: Who answers for the debate's people, and how many times each was asked per round.
        self.people = people or _NO_PEOPLE
        self.asked: dict[tuple[str, int], int] = {} if spec.people else _NO_ASKS
        self.resumed_from = len(self.progress.rounds)
        self.max_rounds = min(spec.max_rounds, max_rounds) if max_rounds else spec.max_rounds
        self.seq = 0
        self.started = time.perf_counter()
        #: A call answered without its usage: what the debate spent is not known in full.
        self.unmetered = False

    # ---- events -------------------------------------------------------------------------------

    def wants(self, event_type: type[ev.DebateEvent]) -> bool:
        """Whether anyone takes ``event_type``: a step whose event costs something to build
        (a verdict's dump) asks first."""
        return self.on_event is not None and (
            self.event_types is None or event_type in self.event_types)

    async def emit(self, event_type: type[Any], /, **fields: Any) -> None:
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
        budget = self.spec.budget
        if budget is not None:
            progress = self.progress
            cost = 0.0 if budget.max_cost is None else spent_cost(self.spec, progress.by_speaker)
            check_budget(budget, progress.calls, progress.usage, request, cost)
        self.progress.calls += 1

    def spend(self, who: str, usage: TokenUsage | None) -> TokenUsage:
        """Count what ``who``'s call spent (a response's usage: None when it reported none)."""
        if usage is None:
            self.unmetered = True
            return ZERO_USAGE
        return self._count(who, usage)

    def spend_failed(self, who: str, exc: BaseException) -> TokenUsage:
        """Count what ``who``'s failed call spent: an LLMError may say (else nothing is known)."""
        usage = exc.usage if isinstance(exc, LLMError) else None
        return ZERO_USAGE if usage is None else self._count(who, usage)

    def _count(self, who: str, usage: TokenUsage) -> TokenUsage:
        progress = self.progress
        progress.usage += usage
        spent = progress.by_speaker.get(who)
        progress.by_speaker[who] = usage if spent is None else spent + usage
        return usage

    # ---- prompts ------------------------------------------------------------------------------

    def prompt(self, phase: str, who: str, number: int,
               transcript: TranscriptText = NO_TRANSCRIPT, **extra: str) -> Message:
        """``phase``'s prompt for ``who``, as the user message of its call: a string template
        filled with the debate's fields (with its breaks: where the prefix it shares with the
        debate's other calls ends), or a callable given a PromptContext (with the DebateState)."""
        spec = self.spec
        template = spec.templates.get(phase)
        if callable(template):
            return Message("user", template(self.context(who, number, phase, transcript.text,
                                                         **extra)))
        values = template_fields(question=self.question, framing=self.framing_field(),
                                 round=number, transcript=transcript.text, **extra)
        bound = spec.bound_templates.get((phase, who))
        if bound is not None:  # the fields the debate fixes are in it already
            text, breaks = fill_parts(bound, values, template, transcript.breaks)
            return Message("user", text, breaks)
        return Message("user", fill_template(
            template, {**values, **fixed_fields(spec, phase, who)}))

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

    def full_transcript(self, pending: Round | None = None) -> TranscriptText:
        """Every committed round, plus a pending round; what judge and synthesis see. Rendered
        from the turns at each call, not kept: a run holds its transcript once."""
        if pending is None:
            return render_transcript(self.progress.rounds)
        return render_transcript(self.progress.rounds, pending.number, pending.turns)

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
        progress = self.progress
        progress.rounds.append(rnd)
        if progress.turns:  # the round's turns committed one by one are in it now
            progress.turns = tuple(t for t in progress.turns if t.round != rnd.number)
        if self.on_commit is not None:
            await self.on_commit(progress, rnd)

    def played(self, speaker: str, number: int) -> Turn | None:
        """``speaker``'s turn in round ``number`` when it was committed alone before a resume
        (debates with people), else None: play it."""
        return next((t for t in self.progress.turns
                     if t.speaker == speaker and t.round == number), None)

    async def commit_turn(self, turn: Turn) -> None:
        """Checkpoint ``turn`` as it ends, before its round does (debates with people only: the
        protocols ask): a run resumed while a person types calls no model of that round
        again."""
        self.progress.turns = (*self.progress.turns, turn)
        if self.on_commit is not None:
            await self.on_commit(self.progress, PlayedTurn(turn=turn))

    def stop_reached(self, number: int) -> bool:
        """The debate's stop rule, after round ``number``."""
        return stop_reached(self.spec, self.progress.rounds, lambda: self.state(number))
