"""One debate in progress: its state (transcript so far, usage, counters, template fields) and
the primitives that change it: emit an event, make a counted call, commit framing and rounds.
The steps a protocol takes over a run are in ``steps``; decisions over values in ``rules``."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from debatebus.engine.definition import DebateSpec, Judge, Participant
from debatebus.engine.prompts import (
    Language,
    PromptContext,
    fill_template,
    names_persona,
    template_fields,
)
from debatebus.engine.result import DebateState, Progress
from debatebus.engine.rules import check_budget, latest_verdict, stop_reached
from debatebus.engine.transcript import Round, Turn, render_round
from debatebus.exceptions import LLMError
from debatebus.llm.base import LLM, LLMRequest, LLMResponse
from debatebus.schemas import events as ev

__all__ = ["OnCommit", "OnEvent", "Run"]

OnEvent = Callable[[ev.DebateEvent], Awaitable[None] | None]
OnCommit = Callable[[Progress, Turn | Round], Awaitable[None]]


def _framing_field(lang: Language, framing: Turn | None) -> str:
    return f"{lang.framing_label}{framing.text}\n" if framing else ""


class Run:
    """The state of one run. Everything spent is counted here, whatever happens to the run."""

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
    ) -> None:
        self.spec = spec
        self.question = question
        self.debate_id = debate_id
        self.request_id = request_id
        self.on_event = on_event
        self.on_commit = on_commit
        self.progress = (
            Progress(resume.framing, list(resume.rounds), resume.usage, resume.calls)
            if resume
            else Progress()
        )
        self.resumed_from = len(self.progress.rounds)
        self.max_rounds = min(spec.max_rounds, max_rounds) if max_rounds else spec.max_rounds
        self.rendered = [render_round(r) for r in self.progress.rounds]
        # The fields every string template shares; speaker, round, transcript… are added per call.
        self.fields = template_fields(
            question=question,
            debate_name=spec.name,
            participants=spec.participant_names,
            framing=_framing_field(spec.lang, self.progress.framing),
        )
        roles = [*spec.participants, spec.moderator, spec.synthesis_speaker, spec.judge]
        if spec.audience:
            roles.append(spec.audience_speaker)
        self.personas = {r.name: r.system_prompt for r in roles if r is not None}
        self.seq = 0
        self.started = time.perf_counter()

    # ---- events -------------------------------------------------------------------------------

    async def emit(self, event_type: type[Any], **fields: Any) -> None:
        if self.on_event is None:
            return
        self.seq += 1
        event = event_type(
            debate_id=self.debate_id, seq=self.seq, request_id=self.request_id, **fields
        )
        handled = self.on_event(event)
        if inspect.isawaitable(handled):
            await handled

    # ---- calls --------------------------------------------------------------------------------

    async def call(self, llm: LLM, request: LLMRequest) -> tuple[LLMResponse, float]:
        """The response and the call's duration in ms (measured only when someone listens)."""
        if self.spec.budget is not None:
            check_budget(self.spec.budget, self.progress.calls, self.progress.usage, request)
        self.progress.calls += 1
        started = time.perf_counter() if self.on_event is not None else 0.0
        try:
            response = await llm.complete(request)
        except LLMError as exc:
            if exc.usage is not None:
                self.progress.usage += exc.usage
            raise
        if response.usage is not None:
            self.progress.usage += response.usage
        elapsed = (time.perf_counter() - started) * 1000.0 if started else 0.0
        return response, elapsed

    # ---- prompts ------------------------------------------------------------------------------

    def prompt(self, phase: str, who: str, number: int, transcript: str = "", **extra: str) -> str:
        """``phase``'s prompt for ``who``: a string template filled with the debate's fields, or a
        callable given a PromptContext (with the DebateState)."""
        template = self.spec.templates.get(phase)
        if callable(template):
            return template(self.context(who, number, phase, transcript, **extra))
        word_limit = self.spec.word_limit_texts.get(phase, "")
        values = {
            **self.fields,
            "speaker": who,
            "round": number,
            "transcript": transcript,
            "word_limit": word_limit,
            "persona": self.personas.get(who, ""),
            **extra,
        }
        return fill_template(template, values)

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
            framing=self.fields["framing"],
            transcript=transcript,
            participants=self.spec.participant_names,
            word_limit=self.spec.word_limit_texts.get(phase, ""),
            persona=self.personas.get(who, ""),
            state=self.state(number),
            **extra,
        )

    def full_transcript(self, pending: str | None = None) -> str:
        """Every committed round, plus a pending round's rendering; what judge and synthesis see."""
        parts = self.rendered if pending is None else [*self.rendered, pending]
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
        self.fields["framing"] = _framing_field(self.spec.lang, turn)
        if self.on_commit is not None:
            await self.on_commit(self.progress, turn)

    async def commit_round(self, rnd: Round, rendered: str) -> None:
        """Append a finished round (``rendered`` is its prompt text) and checkpoint it."""
        self.progress.rounds.append(rnd)
        self.rendered.append(rendered)
        if self.on_commit is not None:
            await self.on_commit(self.progress, rnd)

    def stop_reached(self, number: int) -> bool:
        """The debate's stop rule, after round ``number``."""
        return stop_reached(self.spec, self.progress.rounds, lambda: self.state(number))
