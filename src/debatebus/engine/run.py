"""One debate in progress: calls, accounting, events and commits. Protocols drive it round by round."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import BaseModel

from debatebus.engine.definition import Budget, DebateSpec, Judge, Participant
from debatebus.engine.phi import interpret_phi_hat
from debatebus.engine.prompts import PromptContext, fill_template, template_fields
from debatebus.engine.result import DebateResult, DebateState, Progress
from debatebus.engine.rules import latest_verdict, output_of, parse_verdict, stop_reached
from debatebus.engine.transcript import Round, Turn, render_round
from debatebus.exceptions import BudgetExceededError, LLMError
from debatebus.llm.base import LLM, LLMRequest, LLMResponse, Message, model_name
from debatebus.schemas import events as ev
from debatebus.schemas.usage import ZERO_USAGE, TokenUsage

__all__ = ["DebateFailure", "OnCommit", "OnEvent", "Run"]

OnEvent = Callable[[ev.DebateEvent], Awaitable[None] | None]
OnCommit = Callable[[Progress, Turn | Round], Awaitable[None]]


class DebateFailure(Exception):
    """Ends a run with status ``failed``; the message becomes the result's ``error``."""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _framing_field(framing: Turn | None) -> str:
    return f"Framing: {framing.text}\n" if framing else ""


class Run:
    """Bookkeeping of one run. Everything spent is counted here, whatever happens to the run."""

    def __init__(
        self,
        spec: DebateSpec,
        topic: str,
        debate_id: str,
        *,
        on_event: OnEvent | None = None,
        on_commit: OnCommit | None = None,
        resume: Progress | None = None,
        request_id: str | None = None,
        max_rounds: int | None = None,
    ) -> None:
        self.spec = spec
        self.topic = topic
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
            topic=topic,
            debate_name=spec.name,
            participants=spec.participant_names,
            framing=_framing_field(self.progress.framing),
        )
        self.seq = 0
        self.satisfied = False
        self.synthesis: Turn | None = None
        self.sole_output: str | None = None
        self.phi_hat: float | None = None
        self.started = time.perf_counter()

    # ---- events -------------------------------------------------------------------------------

    async def emit(self, event_type: type[Any], **fields: Any) -> None:
        if self.on_event is None:
            return
        self.seq += 1
        event = event_type(
            debate_id=self.debate_id, seq=self.seq, request_id=self.request_id, **fields
        )
        outcome = self.on_event(event)
        if inspect.isawaitable(outcome):
            await outcome

    # ---- calls --------------------------------------------------------------------------------

    def _check_budget(self, budget: Budget, request: LLMRequest) -> None:
        used = self.progress
        if budget.max_calls is not None and used.calls >= budget.max_calls:
            raise BudgetExceededError(
                f"budget max_calls={budget.max_calls} reached: {used.calls} calls made before "
                f"{request.purpose} by {request.speaker!r} in round {request.round}"
            )
        limit = budget.max_total_tokens
        if limit is not None and used.usage.total_tokens >= limit:
            raise BudgetExceededError(
                f"budget max_total_tokens={limit} reached: {used.usage.total_tokens} tokens spent "
                f"before {request.purpose} by {request.speaker!r} in round {request.round}"
            )

    async def call(self, llm: LLM, request: LLMRequest) -> tuple[LLMResponse, float]:
        """The response and the call's duration in ms (measured only when someone listens)."""
        if self.spec.budget is not None:
            self._check_budget(self.spec.budget, request)
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

    def request(
        self,
        who: Participant | Judge,
        purpose: str,
        number: int,
        prompt: str,
        schema: type[BaseModel] | None = None,
    ) -> LLMRequest:
        system = who.system_prompt
        return LLMRequest(
            system, (Message("user", prompt),), schema, None, who.name, purpose, number
        )

    async def speak(self, who: Participant, purpose: str, number: int, prompt: str) -> Turn:
        """A participant's turn under the failure policy: a failed call becomes a failed turn."""
        llm = self.spec.llm_for(who)
        started = time.perf_counter()
        try:
            response, elapsed = await self.call(llm, self.request(who, purpose, number, prompt))
        except BudgetExceededError as exc:
            raise DebateFailure(str(exc)) from exc
        except Exception as exc:
            usage = exc.usage if isinstance(exc, LLMError) and exc.usage else ZERO_USAGE
            error = _describe(exc)
            await self.emit(
                ev.TurnFailed,
                speaker=who.name,
                round=number,
                text="",
                error=error,
                usage=usage,
                model=model_name(llm),
                duration_ms=(time.perf_counter() - started) * 1000.0,
            )
            if self.spec.failure_policy == "strict":
                raise DebateFailure(
                    f"participant {who.name!r} failed in round {number} ({purpose}): {error}"
                ) from exc
            return Turn(
                speaker=who.name, round=number, text="", usage=usage, failed=True, error=error
            )
        usage = response.usage or ZERO_USAGE
        if self.on_event is not None:
            await self.emit(
                ev.TurnCompleted,
                speaker=who.name,
                round=number,
                text=response.text,
                usage=usage,
                model=response.model or model_name(llm),
                duration_ms=elapsed,
            )
        return Turn(speaker=who.name, round=number, text=response.text, usage=usage)

    async def role_call(
        self,
        who: Participant | Judge,
        purpose: str,
        number: int,
        prompt: str,
        schema: type[BaseModel] | None = None,
    ) -> tuple[LLMResponse, float]:
        """A moderator, judge or synthesizer call: any failure fails the debate."""
        try:
            return await self.call(
                self.spec.llm_for(who), self.request(who, purpose, number, prompt, schema)
            )
        except Exception as exc:
            raise DebateFailure(
                f"{purpose} by {who.name!r} failed in round {number}: {_describe(exc)}"
            ) from exc

    # ---- prompts ------------------------------------------------------------------------------

    def prompt(self, phase: str, who: str, number: int, transcript: str = "", **extra: str) -> str:
        """``phase``'s prompt for ``who``: a string template filled with the debate's fields, or a
        callable given a PromptContext (with the DebateState)."""
        template = self.spec.prompts.get(phase)
        if callable(template):
            return template(self.context(who, number, phase, transcript, **extra))
        word_limit = self.spec.word_limit_texts.get(phase, "")
        values = {
            **self.fields,
            "speaker": who,
            "round": number,
            "transcript": transcript,
            "word_limit": word_limit,
            **extra,
        }
        return fill_template(template, values)

    def context(
        self, who: str, number: int, phase: str, transcript: str = "", **extra: Any
    ) -> PromptContext:
        return PromptContext(
            topic=self.topic,
            debate_name=self.spec.name,
            speaker=who,
            round=number,
            framing=self.fields["framing"],
            transcript=transcript,
            participants=self.spec.participant_names,
            word_limit=self.spec.word_limit_texts.get(phase, ""),
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
            self.topic,
            number,
            tuple(rounds),
            framing,
            latest_verdict(rounds),
            self.progress.usage,
            self.progress.calls,
        )

    # ---- roles --------------------------------------------------------------------------------

    async def frame(self) -> None:
        """The moderator frames the topic once; a resumed debate keeps its committed framing."""
        moderator = self.spec.moderator
        if moderator is None or self.progress.framing is not None:
            return
        prompt = self.prompt("framing", moderator.name, 0)
        response, elapsed = await self.role_call(moderator, "framing", 0, prompt)
        usage = response.usage or ZERO_USAGE
        turn = Turn(speaker=moderator.name, round=0, text=response.text, usage=usage)
        self.progress.framing = turn
        self.fields["framing"] = _framing_field(turn)
        if self.on_commit is not None:
            await self.on_commit(self.progress, turn)
        await self.emit(
            ev.FramingCompleted,
            speaker=moderator.name,
            text=turn.text,
            usage=usage,
            model=self.model_of(response, moderator),
            duration_ms=elapsed,
        )

    async def judge(self, rnd: Round, transcript: str) -> BaseModel:
        judge = self.spec.judge
        assert judge is not None
        prompt = self.prompt("judge", judge.name, rnd.number, transcript)
        response, elapsed = await self.role_call(judge, "judge", rnd.number, prompt, judge.schema)
        verdict = response.structured
        if verdict is None:
            try:
                verdict = parse_verdict(
                    judge.schema,
                    response.text,
                    response.model or model_name(self.spec.llm_for(judge)),
                )
            except LLMError as exc:
                raise DebateFailure(str(exc)) from exc
        if self.on_event is not None:  # dumping a verdict costs more than the rest of a call
            await self.emit(
                ev.VerdictReached,
                round=rnd.number,
                verdict=verdict.model_dump(mode="json"),
                usage=response.usage or ZERO_USAGE,
                speaker=judge.name,
                model=self.model_of(response, judge),
                duration_ms=elapsed,
            )
        return verdict

    async def synthesize(self, who: Participant, number: int, prompt: str) -> None:
        response, elapsed = await self.role_call(who, "synthesis", number, prompt)
        usage = response.usage or ZERO_USAGE
        self.synthesis = Turn(speaker=who.name, round=number, text=response.text, usage=usage)
        await self.emit(
            ev.SynthesisCompleted,
            speaker=who.name,
            text=response.text,
            usage=usage,
            model=self.model_of(response, who),
            duration_ms=elapsed,
        )

    def model_of(self, response: LLMResponse, who: Participant | Judge) -> str:
        return response.model or model_name(self.spec.llm_for(who))

    # ---- rounds -------------------------------------------------------------------------------

    async def start_round(self, number: int, phase: str) -> TokenUsage:
        await self.emit(ev.RoundStarted, round=number, phase=phase)
        return self.progress.usage

    async def finish_round(self, rnd: Round, usage_before: TokenUsage, *, judged: bool) -> bool:
        """Judge, commit and report a round; True when the debate's stop rule is met."""
        rendered = render_round(rnd)
        if judged and self.spec.judge is not None:
            rnd.verdict = await self.judge(rnd, self.full_transcript(rendered))
        rnd.usage = self.progress.usage - usage_before
        self.progress.rounds.append(rnd)
        self.rendered.append(rendered)
        if self.on_commit is not None:
            await self.on_commit(self.progress, rnd)
        await self.emit(ev.RoundCompleted, round=rnd.number, phase=rnd.phase, usage=rnd.usage)
        return judged and self.stop_reached(rnd.number)

    def stop_reached(self, number: int) -> bool:
        return stop_reached(self.spec, self.progress.rounds, lambda: self.state(number))

    async def emit_phi(self) -> None:
        if self.phi_hat is not None:
            await self.emit(
                ev.PhiUpdate, phi_hat=self.phi_hat, level=interpret_phi_hat(self.phi_hat)
            )

    # ---- outcome ------------------------------------------------------------------------------

    def result(self, error: str | None = None) -> DebateResult:
        rounds = self.progress.rounds
        return DebateResult(
            debate_id=self.debate_id,
            topic=self.topic,
            rounds=list(rounds),
            framing=self.progress.framing.text if self.progress.framing else None,
            synthesis=self.synthesis.text if self.synthesis else None,
            output=output_of(self.synthesis, rounds, self.sole_output),
            status="failed" if error is not None else "completed",
            satisfied=self.satisfied and error is None,
            verdict=latest_verdict(rounds),
            error=error,
            token_usage=self.progress.usage,
            phi_hat=self.phi_hat,
            duration_ms=(time.perf_counter() - self.started) * 1000.0,
            calls=self.progress.calls,
            debate_name=self.spec.name,
            resumed_from_round=self.resumed_from,
        )

    async def finish(self, error: str | None) -> DebateResult:
        result = self.result(error)
        if error is None:
            await self.emit(
                ev.DebateCompleted,
                rounds=len(result.rounds),
                satisfied=result.satisfied,
                output=result.output,
                token_usage=result.token_usage,
                duration_ms=result.duration_ms,
            )
        else:
            await self.emit(
                ev.DebateFailed,
                rounds=len(result.rounds),
                error=error,
                token_usage=result.token_usage,
                duration_ms=result.duration_ms,
            )
        return result

    def all_failed(self, turns: Sequence[Turn], number: int, phase: str) -> None:
        if turns and all(t.failed for t in turns):
            raise DebateFailure(
                f"every participant failed in round {number} ({phase}); first error: "
                f"{turns[0].error}"
            )
