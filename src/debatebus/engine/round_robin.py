"""Round-robin: everyone speaks in list order each round, seeing all that was said before them."""

from __future__ import annotations

from debatebus.engine.outcome import Outcome, SynthesisCall
from debatebus.engine.rules import require_a_survivor, round_robin_phi
from debatebus.engine.run import Run
from debatebus.engine.steps import finish_round, frame, speak, start_round
from debatebus.engine.transcript import Round, Turn, render_turns

__all__ = ["run_round_robin"]


def _window_text(run: Run, number: int, current: list[Turn]) -> str:
    """What a debater sees: the last N committed rounds (all without a window) plus this round so far."""
    window = run.spec.transcript_window
    parts = run.rendered if window is None else run.rendered[-window:]
    if current:
        parts = [*parts, render_turns(number, current)]
    return "\n\n".join(parts)


async def _play_round(run: Run, number: int) -> bool:
    """Play, judge and commit round ``number``; True when the stop rule is met."""
    phase = "opening" if number == 1 else "rebuttal"
    usage_before = await start_round(run, number, phase)
    turns: list[Turn] = []
    for participant in run.spec.participants:
        prompt = run.prompt(phase, participant.name, number, _window_text(run, number, turns))
        turns.append(await speak(run, participant, phase, number, prompt))
    require_a_survivor(turns, number, phase)
    await finish_round(run, Round(number=number, turns=turns, phase=phase), usage_before,
                       judged=True)
    return run.stop_reached(number)


async def run_round_robin(run: Run) -> Outcome:
    await frame(run)
    rounds = run.progress.rounds
    # A resumed debate whose last committed round already met the stop rule goes to synthesis.
    satisfied = bool(rounds) and run.stop_reached(rounds[-1].number)
    number = len(rounds)
    while not satisfied and number < run.max_rounds:
        number += 1
        satisfied = await _play_round(run, number)
    return _conclude(run, satisfied, round_robin_phi(run.progress.rounds))


def _conclude(run: Run, satisfied: bool, phi_hat: float | None) -> Outcome:
    """A sole survivor of the last round speaks for the debate; else the synthesizer (or the
    moderator), if any, writes a synthesis."""
    last = run.progress.rounds[-1]
    survivors = [t for t in last.turns if not t.failed]
    if len(run.spec.participants) > 1 and len(survivors) == 1:
        return Outcome(satisfied, phi_hat, sole_output=survivors[0].text)
    writer = run.spec.synthesizer or run.spec.moderator
    if writer is None:
        return Outcome(satisfied, phi_hat)
    prompt = run.prompt("synthesis", writer.name, last.number, run.full_transcript())
    return Outcome(satisfied, phi_hat, synthesis=SynthesisCall(writer, last.number, prompt))
