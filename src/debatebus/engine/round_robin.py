"""Round-robin: everyone speaks in list order each round, seeing all that was said before them."""

from __future__ import annotations

from debatebus.engine.rules import round_robin_phi
from debatebus.engine.run import Run
from debatebus.engine.transcript import Round, Turn, render_turns

__all__ = ["run_round_robin"]


def _window_text(run: Run, number: int, current: list[Turn]) -> str:
    """What a debater sees: the last N committed rounds (all without a window) plus this round so far."""
    window = run.spec.transcript_window
    parts = run.rendered if window is None else run.rendered[-window:]
    if current:
        parts = [*parts, render_turns(number, current)]
    return "\n\n".join(parts)


async def _play_round(run: Run, number: int) -> Round:
    phase = "opening" if number == 1 else "rebuttal"
    usage_before = await run.start_round(number, phase)
    turns: list[Turn] = []
    for participant in run.spec.participants:
        prompt = run.prompt(phase, participant.name, number, _window_text(run, number, turns))
        turns.append(await run.speak(participant, phase, number, prompt))
    run.all_failed(turns, number, phase)
    rnd = Round(number=number, turns=turns, phase=phase)
    run.satisfied = await run.finish_round(rnd, usage_before, judged=True)
    return rnd


async def run_round_robin(run: Run) -> None:
    await run.frame()
    rounds = run.progress.rounds
    # A resumed debate whose last committed round already met the stop rule goes to synthesis.
    run.satisfied = bool(rounds) and run.stop_reached(rounds[-1].number)
    number = len(rounds)
    while not run.satisfied and number < run.max_rounds:
        number += 1
        await _play_round(run, number)
    run.phi_hat = round_robin_phi(run.progress.rounds)
    await run.emit_phi()
    await _conclude(run)


async def _conclude(run: Run) -> None:
    last = run.progress.rounds[-1]
    survivors = [t for t in last.turns if not t.failed]
    if len(run.spec.participants) > 1 and len(survivors) == 1:
        run.sole_output = survivors[0].text
        return
    writer = run.spec.synthesizer or run.spec.moderator
    if writer is not None:
        prompt = run.prompt("synthesis", writer.name, last.number, run.full_transcript())
        await run.synthesize(writer, last.number, prompt)
