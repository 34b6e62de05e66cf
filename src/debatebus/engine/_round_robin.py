"""Round-robin: everyone speaks in list order each round, seeing all that was said before them."""

from __future__ import annotations

from debatebus.engine._outcome import Outcome, SynthesisCall
from debatebus.engine._rules import require_a_survivor, round_robin_phi
from debatebus.engine._run import Run
from debatebus.engine._steps import finish_round, frame, speak, start_round
from debatebus.engine._transcript import Round, TranscriptText, Turn, render_transcript


def _window_text(run: Run, number: int, current: list[Turn]) -> TranscriptText:
    """What a debater sees: the last N committed rounds (all without a window) plus this round so
    far, rendered from the turns."""
    window = run.spec.transcript_window
    rounds = run.progress.rounds if window is None else run.progress.rounds[-window:]
    return render_transcript(rounds, number, current)


async def run_round_robin(run: Run) -> Outcome:
    await frame(run)
    rounds = run.progress.rounds
    # A resumed debate whose last committed round already met the stop rule goes to synthesis.
    satisfied = bool(rounds) and run.stop_reached(rounds[-1].number)
    number = len(rounds)
    # Each round is played here, not by a coroutine of its own: one frame fewer per debate in flight.
    while not satisfied and number < run.max_rounds:
        number += 1
        phase = "opening" if number == 1 else "rebuttal"
        usage_before = await start_round(run, number, phase)
        turns: list[Turn] = []
        people = bool(run.spec.people)  # asked once: a debate without people pays nothing more
        for participant in run.spec.participants:
            # A turn committed alone before a resume is not played again (debates with people).
            turn = run.played(participant.name, number) if run.progress.turns else None
            if turn is None:
                turn = await speak(run, participant, phase, number, run.prompt(
                    phase, participant.name, number, _window_text(run, number, turns)))
                if people:
                    await run.commit_turn(turn)
            turns.append(turn)
        require_a_survivor(turns, number, phase)
        await finish_round(run, Round(number=number, turns=turns, phase=phase), usage_before,
                           judged=True)
        satisfied = run.stop_reached(number)
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
