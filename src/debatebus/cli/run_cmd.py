"""``debatebus run "question"``: one debate in the terminal, each turn shown as it finishes.

On a terminal with ``rich`` installed, speaker names are coloured and a spinner runs while a model
works; otherwise (piped output, no rich) the same lines are printed as plain text. ``--json``
prints only the result document, for scripts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from debatebus.cli.common import positive_int
from debatebus.demo import build_debate
from debatebus.engine import Debate, interpret_phi_hat
from debatebus.engine.cross_pollination import ROUNDS as CROSS_POLLINATION_ROUNDS
from debatebus.engine.definition import PROTOCOLS, Judge
from debatebus.engine.presets import PRESETS
from debatebus.engine.prompts import LANGUAGES
from debatebus.exceptions import ConfigError
from debatebus.handlers.results import result_fields, to_builtins
from debatebus.llm.registry import resolve_llm
from debatebus.pricing import DEFAULT_PRICES, Prices
from debatebus.schemas import events as ev

if TYPE_CHECKING:
    from debatebus.engine.result import DebateResult

__all__ = ["DebateView", "add_parser", "run", "screen_for"]

_PALETTE = ("cyan", "magenta", "green", "yellow", "blue", "bright_red")
_MODERATOR_COLOUR = "bright_white"
_JUDGE_COLOUR = "red"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run one debate in the terminal",
        description="Run the demo debate (optimist, critic, pragmatist and a moderator), or a "
        "preset panel, on TOPIC.",
    )
    parser.add_argument("question", help='what to debate, e.g. "Should we adopt microservices?"')
    parser.add_argument(
        "--llm",
        metavar="MODEL",
        help="local, openai:MODEL, openai:MODEL@http://host:port/v1, anthropic:MODEL or "
        "scripted:FILE.json (default: $DEBATEBUS_LLM, else local)",
    )
    parser.add_argument("--protocol", choices=PROTOCOLS, default="round-robin",
                        help="the demo debate's protocol (a preset has its own)")
    parser.add_argument("--preset", choices=list(PRESETS),
                        help="a ready panel from debatebus.engine.presets instead of the demo debate")
    parser.add_argument("--language", choices=sorted(LANGUAGES), default="en",
                        help="language of the shipped prompts (default en)")
    parser.add_argument("--rounds", type=positive_int, default=2, metavar="N",
                        help="round cap of a round-robin debate (default 2); cross-pollination "
                        "always plays 2 (positions, then revisions)")
    parser.add_argument("--judge", action="store_true", help="add a judge that rules each round")
    parser.add_argument("--prices", metavar="FILE",
                        help="price its calls: a JSON or TOML price table (docs/cost.md), or "
                        "'default' for debatebus.pricing.DEFAULT_PRICES; the outcome then says "
                        "what it cost when every model is priced")
    parser.add_argument("--json", action="store_true", help="print the result document only")
    parser.set_defaults(func=run)


def _build(args: argparse.Namespace) -> Debate:
    llm = resolve_llm(args.llm)
    if args.preset is not None:
        debate = Debate.from_preset(args.preset, llm=llm, max_rounds=args.rounds,
                                    judge=Judge() if args.judge else None, language=args.language)
    else:
        debate = build_debate(llm, judge=args.judge, rounds=args.rounds, protocol=args.protocol)
        debate = dataclasses.replace(debate, language=args.language)
    if args.prices is not None:
        debate = dataclasses.replace(debate, prices=(
            DEFAULT_PRICES if args.prices == "default" else Prices.from_file(args.prices)))
    if debate.spec.protocol == "cross-pollination" and args.rounds != CROSS_POLLINATION_ROUNDS:
        raise ConfigError(f"cross-pollination always plays {CROSS_POLLINATION_ROUNDS} rounds "
                          "(positions, then revisions): --rounds applies to round-robin only")
    return debate


async def run(args: argparse.Namespace) -> int:
    """Exit code: 0 when the debate completed, 1 when it failed, 2 when it could not start."""
    try:
        debate = _build(args)
    except ImportError as exc:  # a provider's optional extra is missing; the message says which
        print(f"debatebus: {exc}", file=sys.stderr)
        return 2
    if args.json:
        result = await debate.run(args.question)
        print(json.dumps(result_fields(result), indent=2, ensure_ascii=False))
        return 0 if result.ok else 1
    view = DebateView(debate, screen_for(sys.stdout))
    try:
        result = await debate.run(args.question, on_event=view.on_event)
    finally:
        view.screen.close()
    view.summary(result, _stop_rule(debate))
    return 0 if result.ok else 1


def _stop_rule(debate: Debate) -> str:
    """What ends the debate before its round cap, as the outcome line names it."""
    spec = debate.spec
    if spec.until is not None:
        return "its until rule"
    return "the judge" if spec.judge is not None else "the protocol"


# --- screens: where lines go ---------------------------------------------------------------------


class Screen(Protocol):
    def heading(self, text: str) -> None: ...

    def speech(self, speaker: str, colour: str, meta: str, text: str) -> None: ...

    def note(self, text: str) -> None: ...

    def status(self, text: str) -> None: ...

    def close(self) -> None: ...


class PlainScreen:
    """Plain lines for pipes, logs and terminals without rich."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def _print(self, text: str) -> None:
        print(text, file=self._out, flush=True)

    def heading(self, text: str) -> None:
        self._print(f"\n== {text} ==")

    def speech(self, speaker: str, colour: str, meta: str, text: str) -> None:
        self._print(f"\n{speaker} ({meta}):\n{text.strip()}")

    def note(self, text: str) -> None:
        self._print(text)

    def status(self, text: str) -> None:
        pass  # no spinner when nobody watches a terminal

    def close(self) -> None:
        pass


class RichScreen:
    """Coloured speaker names and a spinner that says which model is working."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console

        self._console = Console(file=out, highlight=False)
        self._spinner = self._console.status("starting…", spinner="dots")
        self._spinner.start()

    def heading(self, text: str) -> None:
        self._console.rule(text, style="dim")

    def speech(self, speaker: str, colour: str, meta: str, text: str) -> None:
        from rich.text import Text

        line = Text.assemble((speaker, f"bold {colour}"), (f"  {meta}", "dim"))
        self._console.print(line)
        self._console.print(Text(text.strip()), end="\n\n")  # Text: model output is not markup

    def note(self, text: str) -> None:
        from rich.text import Text

        self._console.print(Text(text))

    def status(self, text: str) -> None:
        self._spinner.update(text)

    def close(self) -> None:
        self._spinner.stop()


def screen_for(out: TextIO) -> Screen:
    """Where a live view writes: rich on a terminal (when installed), plain lines otherwise."""
    if out.isatty():
        try:
            return RichScreen(out)
        except ImportError:
            pass
    return PlainScreen(out)


# --- the view: events → lines --------------------------------------------------------------------


class DebateView:
    """Turns debate events into screen lines, and says who the debate is waiting for."""

    def __init__(self, debate: Debate, screen: Screen) -> None:
        spec = debate.spec
        self.screen = screen
        self._participants = [p.name for p in spec.participants]
        self._concurrent = spec.protocol == "cross-pollination"
        self._has_judge = spec.judge is not None
        writer = spec.synthesis_speaker
        self._synthesizer = writer.name if writer is not None else None
        self._moderator = spec.moderator.name if spec.moderator is not None else None
        self._spoken: set[str] = set()
        self._colours = {
            name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(self._participants)
        }

    def _colour(self, speaker: str) -> str:
        if speaker == "judge":
            return _JUDGE_COLOUR
        return self._colours.get(speaker, _MODERATOR_COLOUR)

    def on_event(self, event: ev.DebateEvent) -> None:
        self._show(event)
        waiting = self._waiting_for(event)
        if waiting:
            self.screen.status(waiting)

    def _show(self, event: ev.DebateEvent) -> None:
        match event:
            case ev.DebateStarted():
                self.screen.note(
                    f"Debate: {event.question}  ({event.protocol}, ≤ {event.max_rounds} rounds)"
                )
            case ev.FramingCompleted():
                self._speech(
                    event.speaker,
                    "framing",
                    event.usage.total_tokens,
                    event.duration_ms,
                    event.text,
                )
            case ev.RoundStarted():
                self._spoken.clear()
                self.screen.heading(
                    f"Round {event.round}" + (f" · {event.phase}" if event.phase else "")
                )
            case ev.TurnCompleted():
                self._spoken.add(event.speaker)
                self._speech(
                    event.speaker,
                    f"round {event.round}",
                    event.usage.total_tokens,
                    event.duration_ms,
                    event.text,
                )
            case ev.TurnFailed():
                self._spoken.add(event.speaker)
                self.screen.note(f"{event.speaker} failed in round {event.round}: {event.error}")
            case ev.VerdictReached():
                self._speech(
                    "judge",
                    f"verdict, round {event.round}",
                    event.usage.total_tokens,
                    event.duration_ms,
                    _verdict_text(event.verdict),
                )
            case _:
                pass  # synthesis, Φ̂ and the outcome are part of the summary

    def _speech(self, speaker: str, what: str, tokens: int, duration_ms: float, text: str) -> None:
        meta = f"{what} · {tokens} tokens · {duration_ms / 1000:.1f} s"
        self.screen.speech(speaker, self._colour(speaker), meta, text)

    def _waiting_for(self, event: ev.DebateEvent) -> str | None:
        if isinstance(event, ev.DebateCompleted | ev.DebateFailed | ev.PhiUpdate):
            return None
        if isinstance(event, ev.DebateStarted) and self._moderator and not self._concurrent:
            return f"{self._moderator} is framing the topic…"
        if isinstance(event, ev.RoundCompleted | ev.VerdictReached | ev.SynthesisCompleted):
            return (
                f"{self._synthesizer} is writing the synthesis…"
                if self._synthesizer
                else "finishing…"
            )
        pending = [name for name in self._participants if name not in self._spoken]
        if not pending:
            return "the judge is deliberating…" if self._has_judge else "finishing…"
        if self._concurrent:
            return f"{', '.join(pending)} thinking…"
        return f"{pending[0]} is thinking…"

    def summary(self, result: DebateResult, stop_rule: str) -> None:
        screen = self.screen
        if result.synthesis:
            screen.heading("Synthesis")
            screen.speech(
                self._synthesizer or "synthesis", _MODERATOR_COLOUR, "synthesis", result.synthesis
            )
        if result.verdict is not None:
            screen.heading("Verdict")
            screen.note(_verdict_text(to_builtins(result.verdict)))
        screen.heading("Outcome")
        for line in _outcome_lines(result, stop_rule):
            screen.note(line)


def _verdict_text(verdict: Any) -> str:
    if not isinstance(verdict, dict):
        return str(verdict)
    return "\n".join(f"{key}: {value}" for key, value in verdict.items())


def _outcome_lines(result: DebateResult, stop_rule: str) -> list[str]:
    usage = result.token_usage
    status: str = result.status
    if result.ok:
        status += f" (stopped by {stop_rule})" if result.satisfied else " (round limit reached)"
    lines = [f"status: {status} in {result.duration_ms / 1000:.1f} s, {len(result.rounds)} rounds"]
    if result.error:
        lines.append(f"error: {result.error}")
    phi = (
        "n/a (needs two rounds)"
        if result.phi_hat is None
        else (f"{result.phi_hat:.2f} ({interpret_phi_hat(result.phi_hat)} change of positions)")
    )
    lines.append(f"Φ̂: {phi}")
    cached = (f", {usage.cache_read_tokens} of the prompt read from the cache"
              if usage.cache_read_tokens else "")
    lines.append(
        f"tokens: {usage.total_tokens} ({usage.prompt_tokens} prompt + "
        f"{usage.completion_tokens} completion{cached}) over {result.calls} calls"
    )
    if result.cost is not None:
        lines.append(f"cost: {result.cost.total:.6f} {result.cost.currency}")
    return lines
