"""Cross-pollination: independent positions (1a), revisions after seeing the others (1b), then one
synthesis that weighs each participant's utility instead of averaging. Phases run concurrently."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from debatebus._usage import ZERO_USAGE
from debatebus.engine._definition import CROSS_POLLINATION_ROUNDS, Participant
from debatebus.engine._outcome import Outcome, SynthesisCall
from debatebus.engine._phi import compute_phi_hat
from debatebus.engine._rules import DebateFailure, require_a_survivor
from debatebus.engine._run import Run
from debatebus.engine._steps import (
    finish_round,
    frame,
    model_of,
    role_text,
    speak,
    start_round,
)
from debatebus.engine._subdebates import SubDebateSession
from debatebus.engine._transcript import Round, Turn
from debatebus.llm._base import Message
from debatebus.schemas import events as ev

#: The rounds it always plays, positions then revisions (``max_rounds`` does not apply).
ROUNDS = CROSS_POLLINATION_ROUNDS
AUDIENCE, POSITION, REVISION = 0, 1, ROUNDS


def _committed(run: Run, number: int) -> Round | None:
    return next((r for r in run.progress.rounds if r.number == number), None)


def _position_lines(run: Run, texts: Mapping[str, str]) -> dict[str, str]:
    """Each participant's text as the others see it: name, utility, then the text."""
    utilities = run.spec.utility_texts
    return {name: f"[{name}]{utilities.get(name, '')} {text}" for name, text in texts.items()}


def _positions_text(lines: Mapping[str, str], exclude: str = "") -> str:
    return "\n".join(line for name, line in lines.items() if name != exclude)


async def _audience(run: Run) -> str:
    if not run.spec.audience:
        return ""
    rnd = _committed(run, AUDIENCE)
    if rnd is None:
        who = run.spec.audience_speaker
        usage_before = await start_round(run, AUDIENCE, "audience")
        prompt = run.prompt("audience", who.name, AUDIENCE, audience=run.spec.audience)
        response, text, elapsed = await role_text(run, who, "audience", AUDIENCE, prompt)
        usage = response.usage or ZERO_USAGE
        turn = Turn(speaker=who.name, round=AUDIENCE, text=text, usage=usage)
        await run.emit(
            ev.TurnCompleted,
            speaker=who.name,
            round=AUDIENCE,
            text=turn.text,
            usage=usage,
            model=model_of(run.spec, response, who),
            duration_ms=elapsed,
        )
        rnd = Round(number=AUDIENCE, turns=[turn], phase="audience")
        await finish_round(run, rnd, usage_before, judged=False)
    return f"{run.spec.lang.audience_label}{rnd.turns[0].text}\n"


async def _phase(
    run: Run,
    number: int,
    phase: str,
    audience: str,
    speakers: list[Participant],
    texts: Mapping[str, str],
    children: SubDebateSession | None = None,
) -> Round:
    """A phase's round; in 1b (``children`` given) a position may ask for a sub-debate."""
    rnd = _committed(run, number)
    if rnd is not None:
        return rnd
    usage_before = await start_round(run, number, phase)
    lines = _position_lines(run, texts)

    def prompt_of(p: Participant, offer: str) -> Message:
        return run.prompt(
            phase,
            p.name,
            number,
            audience=audience,
            utility=run.spec.utility_texts.get(p.name, ""),
            maximizes=p.utility.maximizes if p.utility else "",
            penalizes=p.utility.penalizes if p.utility else "",
            positions=_positions_text(lines, exclude=p.name),
            sub_debates=offer,
        )

    async def turn(p: Participant) -> Turn:
        played = run.played(p.name, number) if run.progress.turns else None  # resumed
        if played is not None:
            return played
        said = await speak(run, p, phase, number, prompt_of(p, children.offer if children else ""))
        if children is not None:

            async def reissue(feedback: str) -> Turn:
                asked = prompt_of(p, "")
                return await speak(run, p, phase, number,
                                   Message("user", asked.content + feedback, asked.breaks))

            said = await children.answer(p, said, reissue)
        if run.spec.people:
            await run.commit_turn(said)
        return said

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(turn(p)) for p in speakers]
    except* DebateFailure as failures:
        raise failures.exceptions[0] from None
    turns = [t.result() for t in tasks]
    if number == POSITION:  # a failed revision falls back to its position instead
        require_a_survivor(turns, number, phase)
    rnd = Round(number=number, turns=turns, phase=phase)
    await finish_round(run, rnd, usage_before, judged=number == REVISION)
    return rnd


async def run_cross_pollination(run: Run, children: SubDebateSession | None = None) -> Outcome:
    await frame(run)
    audience = await _audience(run)
    everyone = list(run.spec.participants)
    positions = (await _phase(run, POSITION, "position", audience, everyone, {})).texts()
    if len(positions) == 1:
        return Outcome(False, sole_output=next(iter(positions.values())))
    survivors = [p for p in everyone if p.name in positions]
    revision = await _phase(run, REVISION, "revision", audience, survivors, positions, children)
    revised = {**positions, **revision.texts()}  # a failed revision falls back to its position
    # Without a judge or ``until``, the protocol itself is the stop rule.
    no_rule = run.spec.judge is None and run.spec.until is None
    satisfied = no_rule or run.stop_reached(REVISION)
    writer = run.spec.synthesis_speaker
    assert writer is not None  # validated at construction
    prompt = run.prompt(
        "synthesis",
        writer.name,
        REVISION,
        audience=audience,
        positions=_positions_text(_position_lines(run, revised)),
    )
    return Outcome(
        satisfied, compute_phi_hat(positions, revised), synthesis=SynthesisCall(writer, REVISION, prompt)
    )
