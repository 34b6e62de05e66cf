"""The steps a protocol takes over a ``Run``: turns under the failure policy, role calls (framing,
judge, synthesis), round bookkeeping, and the final result with its event."""

from __future__ import annotations

import asyncio
import functools
import time

from pydantic import BaseModel

from debatebus._usage import ZERO_USAGE, TokenUsage
from debatebus.engine._definition import DebateSpec, Judge, Participant
from debatebus.engine._outcome import Outcome, SynthesisCall
from debatebus.engine._people import hear
from debatebus.engine._phi import interpret_phi_hat
from debatebus.engine._result import DebateResult, StopReason
from debatebus.engine._rules import (
    DebateFailure,
    debate_cost,
    latest_verdict,
    output_of,
    parse_verdict,
)
from debatebus.engine._run import Run, TurnKey, TurnText
from debatebus.engine._transcript import Round, Turn, clean_turn, fit_words, speaker_tags
from debatebus.exceptions import BudgetExceededError, LLMError, SpendLimitError, TransportError
from debatebus.llm._base import LLM, LLMRequest, LLMResponse, Message, model_name
from debatebus.schemas import events as ev


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _stop_reason(exc: BaseException) -> StopReason | None:
    """What a failed call says stopped the debate: a budget limit, or a spend limit."""
    if isinstance(exc, BudgetExceededError):
        return exc.limit
    return "spend_limit" if isinstance(exc, SpendLimitError) else None


def request_for(
    run: Run,
    who: Participant | Judge,
    purpose: str,
    number: int,
    prompt: Message,
    schema: type[BaseModel] | None = None,
) -> LLMRequest:
    """The request for ``who``'s ``purpose`` call: free text stops at another speaker's tag and,
    under a word limit, at a token budget that fits it. Every call of a debate has its id as
    ``cache_key``."""
    limit = run.spec.limits.get(purpose)
    stop = () if schema is not None else _stops(run, who.name)
    return LLMRequest(
        run.system_for(purpose, who),
        (prompt,),
        schema,
        _token_budget(limit) if limit else None,
        who.name,
        purpose,
        number,
        stop,
        run.debate_id,
    )


def _stops(run: Run, speaker: str) -> tuple[str, ...]:
    return _stops_among(tuple(run.spec.personas), speaker)


@functools.lru_cache(maxsize=256)
def _stops_among(names: tuple[str, ...], speaker: str) -> tuple[str, ...]:
    """Fixed for a whole debate: built once per speaker, not per call."""
    others = (name for name in names if name != speaker)
    return (*(tag for name in others for tag in speaker_tags(name)), "\nRound ", "\n---")


def _token_budget(words: int) -> int:
    """Tokens for ``words`` words with room to finish a sentence (English: ~1.3 tokens a word);
    ``clean_text`` then trims the text to the limit."""
    return words * 8 // 5 + 8


def clean_text(run: Run, who: Participant | Judge, purpose: str, text: str) -> str:
    """A free-text answer as the transcript keeps it: cut where another turn starts, within the
    phase's word limit."""
    return fit_words(clean_turn(text, who.name, run.spec.personas), run.spec.limits.get(purpose))


def model_of(spec: DebateSpec, response: LLMResponse, who: Participant | Judge) -> str:
    return response.model or model_name(spec.llm_for(who))


async def _written(llm: LLM, request: LLMRequest, text: TurnText) -> LLMResponse:
    """The answer to ``request``, streamed: each piece to ``text`` as the model writes it."""
    async with llm.stream(request, interval_s=text.interval_s) as stream:
        async for piece in stream:
            text.write(piece)
    response = stream.response
    assert response is not None  # the loop ran to the stream's end
    return response


def _writing(run: Run, who: Participant | Judge, purpose: str, number: int) -> TurnText:
    assert run.on_text is not None
    return run.on_text(TurnKey(number, who.name, purpose))


async def speak(run: Run, who: Participant, purpose: str, number: int, prompt: Message) -> Turn:
    """A participant's turn under the failure policy: a failed call becomes a failed turn. An
    answer that was all heading or another speaker's turn (nothing left once cleaned; not an
    empty answer, which is kept as is) is asked for once more: a small model that continued the
    transcript usually answers as itself the second time. With ``run.on_text`` the answer is
    streamed to it (the second ask to a new ``TurnText``), and committed before it is reported.
    A person's turn is asked of them (``people.hear``), and not streamed."""
    people = run.spec.people
    if people and who.name in people:
        return await hear(run, people[who.name], purpose, number, prompt)
    llm = run.spec.llm_for(who)
    started = time.perf_counter()
    spent = ZERO_USAGE
    writing: TurnText | None = None
    try:
        request = request_for(run, who, purpose, number, prompt)
        for _ in range(2):
            run.count_call(request)
            if run.on_text is None:
                response = await llm.complete(request)
            else:
                if writing is not None:
                    writing.discard()
                writing = _writing(run, who, purpose, number)
                response = await _written(llm, request, writing)
            spent = spent + run.spend(who.name, response.usage)
            text = clean_text(run, who, purpose, response.text)
            if text or not response.text.strip():
                break
    except (BudgetExceededError, SpendLimitError) as exc:
        # Not the participant's failure: the debate stops (a budget for good; a spend limit
        # until its window ends).
        run.spend_failed(who.name, exc)
        _discard(writing)
        raise DebateFailure(str(exc), final=isinstance(exc, BudgetExceededError),
                            stop_reason=_stop_reason(exc)) from exc
    except (TransportError, asyncio.CancelledError):
        # The broker, store or limiter failed, not the participant (the delivery is released),
        # or the run was stopped: the turn ends here, without a text.
        _discard(writing)
        raise
    except Exception as exc:
        usage = spent + run.spend_failed(who.name, exc)
        if writing is not None:
            await writing.commit("")
        return await _failed_turn(run, who, purpose, number, exc, usage, started)
    if writing is not None:
        await writing.commit(text)
    if run.wants(ev.TurnCompleted):
        await run.emit(
            ev.TurnCompleted,
            speaker=who.name,
            round=number,
            text=text,
            usage=spent,
            model=response.model or model_name(llm),
            duration_ms=(time.perf_counter() - started) * 1000.0,
        )
    return Turn(speaker=who.name, round=number, text=text, usage=spent)


async def _failed_turn(run: Run, who: Participant, purpose: str, number: int, exc: Exception,
                       usage: TokenUsage, started: float) -> Turn:
    """``who``'s turn failed by ``exc``, reported: in strict mode the debate fails."""
    error = _describe(exc)
    await run.emit(
        ev.TurnFailed,
        speaker=who.name,
        round=number,
        text="",
        error=error,
        usage=usage,
        model=model_name(run.spec.llm_for(who)),
        duration_ms=(time.perf_counter() - started) * 1000.0,
    )
    if run.spec.failure_policy == "strict":
        raise DebateFailure(
            f"participant {who.name!r} failed in round {number} ({purpose}): {error}"
        ) from exc
    return Turn(speaker=who.name, round=number, text="", usage=usage, failed=True, error=error)


def _discard(writing: TurnText | None) -> None:
    if writing is not None:
        writing.discard()


async def role_text(run: Run, who: Participant | Judge, purpose: str, number: int,
                    prompt: Message) -> tuple[LLMResponse, str, float]:
    """A free-text role call (framing, audience, synthesis): its response, its text as the
    transcript keeps it, and its duration in ms; any failure fails the debate. With
    ``run.on_text`` the answer is streamed to it, and committed before it is reported."""
    writing = _writing(run, who, purpose, number) if run.on_text is not None else None
    try:
        response, elapsed = await role_call(run, who, purpose, number, prompt, writing=writing)
    except BaseException:
        _discard(writing)
        raise
    text = clean_text(run, who, purpose, response.text)
    if writing is not None:
        await writing.commit(text)
    return response, text, elapsed


async def role_call(
    run: Run,
    who: Participant | Judge,
    purpose: str,
    number: int,
    prompt: Message,
    schema: type[BaseModel] | None = None,
    *,
    writing: TurnText | None = None,
) -> tuple[LLMResponse, float]:
    """A moderator, judge or synthesizer call, and its duration in ms: any failure fails the
    debate. With ``writing``, the answer is streamed to it."""
    started = time.perf_counter()
    try:
        request = request_for(run, who, purpose, number, prompt, schema)
        run.count_call(request)
        llm = run.spec.llm_for(who)
        response = (await llm.complete(request) if writing is None
                    else await _written(llm, request, writing))
    except TransportError:
        raise  # the broker, store or limiter failed, not the model: the delivery is released
    except Exception as exc:
        run.spend_failed(who.name, exc)
        raise DebateFailure(
            f"{purpose} by {who.name!r} failed in round {number}: {_describe(exc)}",
            final=isinstance(exc, BudgetExceededError),  # running again meets the same budget
            stop_reason=_stop_reason(exc),
        ) from exc
    run.spend(who.name, response.usage)
    return response, (time.perf_counter() - started) * 1000.0


async def frame(run: Run) -> None:
    """The moderator frames the topic once; a resumed debate keeps its committed framing."""
    moderator = run.spec.moderator
    if moderator is None or run.progress.framing is not None:
        return
    prompt = run.prompt("framing", moderator.name, 0)
    response, text, elapsed = await role_text(run, moderator, "framing", 0, prompt)
    usage = response.usage or ZERO_USAGE
    turn = Turn(speaker=moderator.name, round=0, text=text, usage=usage)
    await run.commit_framing(turn)
    await run.emit(
        ev.FramingCompleted,
        speaker=moderator.name,
        text=turn.text,
        usage=usage,
        model=model_of(run.spec, response, moderator),
        duration_ms=elapsed,
    )


async def judge(run: Run, rnd: Round) -> BaseModel:
    """The judge's verdict on the debate so far, ``rnd`` (not committed yet) included."""
    judge = run.spec.judge
    assert judge is not None
    prompt = run.prompt("judge", judge.name, rnd.number, run.full_transcript(rnd))
    response, elapsed = await role_call(run, judge, "judge", rnd.number, prompt, judge.schema)
    verdict = response.structured
    if verdict is None:
        try:
            verdict = parse_verdict(judge.schema, response.text, model_of(run.spec, response, judge))
        except LLMError as exc:
            raise DebateFailure(str(exc)) from exc
    if run.wants(ev.VerdictReached):  # dumping a verdict costs more than the rest of a call
        await run.emit(
            ev.VerdictReached,
            round=rnd.number,
            verdict=verdict.model_dump(mode="json"),
            usage=response.usage or ZERO_USAGE,
            speaker=judge.name,
            model=model_of(run.spec, response, judge),
            duration_ms=elapsed,
        )
    return verdict


async def synthesize(run: Run, call: SynthesisCall) -> Turn:
    who = call.writer
    response, text, elapsed = await role_text(run, who, "synthesis", call.round, call.prompt)
    usage = response.usage or ZERO_USAGE
    await run.emit(
        ev.SynthesisCompleted,
        speaker=who.name,
        text=text,
        usage=usage,
        model=model_of(run.spec, response, who),
        duration_ms=elapsed,
    )
    return Turn(speaker=who.name, round=call.round, text=text, usage=usage)


async def start_round(run: Run, number: int, phase: str) -> TokenUsage:
    """Announce a round; the usage so far, from which the round's own usage is counted."""
    if run.wants(ev.RoundStarted):  # asked first: no coroutine for an event nobody takes
        await run.emit(ev.RoundStarted, round=number, phase=phase)
    return run.progress.usage


async def finish_round(run: Run, rnd: Round, usage_before: TokenUsage, *, judged: bool) -> None:
    """Judge (when ``judged`` and the debate has a judge), commit and report a round."""
    if judged and run.spec.judge is not None:
        rnd.verdict = await judge(run, rnd)
    rnd.usage = run.progress.usage - usage_before
    await run.commit_round(rnd)
    if run.wants(ev.RoundCompleted):
        await run.emit(ev.RoundCompleted, round=rnd.number, phase=rnd.phase, usage=rnd.usage)


async def emit_phi(run: Run, phi_hat: float | None) -> None:
    if phi_hat is not None:
        await run.emit(ev.PhiUpdate, phi_hat=phi_hat, level=interpret_phi_hat(phi_hat))


def debate_result(run: Run, outcome: Outcome | None, synthesis: Turn | None,
                  failure: DebateFailure | None = None) -> DebateResult:
    """The run's state and its protocol's outcome (None when the debate failed before one);
    ``failure``: what failed it (whether that may pass, what stopped it)."""
    progress = run.progress
    rounds = progress.rounds
    sole = outcome.sole_output if outcome is not None else None
    children = list(progress.sub_debates)
    return DebateResult(
        debate_id=run.debate_id,
        question=run.question,
        rounds=list(rounds),
        framing=progress.framing.text if progress.framing else None,
        synthesis=synthesis.text if synthesis else None,
        output=output_of(synthesis, rounds, sole),
        status="failed" if failure is not None else "completed",
        satisfied=outcome is not None and outcome.satisfied and failure is None,
        verdict=latest_verdict(rounds),
        error=None if failure is None else str(failure),
        token_usage=progress.usage,
        phi_hat=outcome.phi_hat if outcome is not None else None,
        duration_ms=(time.perf_counter() - run.started) * 1000.0,
        calls=progress.calls,
        debate_name=run.spec.name,
        resumed_from_round=run.resumed_from,
        sub_debates=children,
        retryable=failure is not None and not failure.final,
        stop_reason=None if failure is None else failure.stop_reason,
        cost=None if run.unmetered else debate_cost(run.spec, progress.by_speaker, children),
    )


async def finish(run: Run, outcome: Outcome | None, synthesis: Turn | None,
                 failure: DebateFailure | None = None) -> DebateResult:
    """The result, announced as DebateCompleted or DebateFailed."""
    result = debate_result(run, outcome, synthesis, failure)
    if result.error is None:
        await run.emit(
            ev.DebateCompleted,
            rounds=len(result.rounds),
            satisfied=result.satisfied,
            output=result.output,
            token_usage=result.token_usage,
            duration_ms=result.duration_ms,
            cost=result.cost,
        )
    else:
        await run.emit(
            ev.DebateFailed,
            rounds=len(result.rounds),
            error=result.error,
            token_usage=result.token_usage,
            duration_ms=result.duration_ms,
            retryable=result.retryable,
            stop_reason=result.stop_reason,
            cost=result.cost,
        )
    return result
