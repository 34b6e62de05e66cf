"""``debatebus run "question"``: one debate in the terminal, each turn shown as the model writes it
(``--no-stream``: as it finishes).

On a terminal with ``rich`` installed, speaker names are coloured, a spinner runs while a model
thinks and a turn's text grows in place as it is written, then is printed as the transcript keeps
it; otherwise (piped output, no rich) the pieces are printed as they come, then the turn's figures.
``--json`` prints only the result document, for scripts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from debatebus._demo import build_debate
from debatebus._pricing import DEFAULT_PRICES, Prices
from debatebus.cli._common import positive_int
from debatebus.engine import Debate, interpret_phi_hat
from debatebus.engine._cross_pollination import ROUNDS as CROSS_POLLINATION_ROUNDS
from debatebus.engine._definition import PROTOCOLS, Judge
from debatebus.engine._presets import PRESETS
from debatebus.engine._prompts import LANGUAGES
from debatebus.engine._run import TurnKey
from debatebus.exceptions import ConfigError
from debatebus.handlers._results import result_fields, to_builtins
from debatebus.llm._registry import resolve_llm
from debatebus.schemas import events as ev

if TYPE_CHECKING:
    from debatebus.engine._result import DebateResult

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
                        help="a ready panel from debatebus.engine._presets instead of the demo debate")
    parser.add_argument("--language", choices=sorted(LANGUAGES), default="en",
                        help="language of the shipped prompts (default en)")
    parser.add_argument("--rounds", type=positive_int, default=2, metavar="N",
                        help="round cap of a round-robin debate (default 2); cross-pollination "
                        "always plays 2 (positions, then revisions)")
    parser.add_argument("--judge", action="store_true", help="add a judge that rules each round")
    parser.add_argument("--prices", metavar="FILE",
                        help="price its calls: a JSON or TOML price table (docs/cost.md), or "
                        "'default' for debatebus._pricing.DEFAULT_PRICES; the outcome then says "
                        "what it cost when every model is priced")
    parser.add_argument("--json", action="store_true", help="print the result document only")
    parser.add_argument("--no-stream", action="store_true",
                        help="show each turn once it is finished, not as the model writes it")
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
        result = await debate.run(args.question, on_event=view.on_event,
                                  on_text=None if args.no_stream else view.on_text)
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

    def speech(self, speaker: str, colour: str, meta: str, text: str,
               typed: str | None = None) -> None:
        """A finished turn; ``typed``: its raw text, shown already as it was written."""

    def typing(self, speaker: str, colour: str, what: str) -> None:
        """A turn starts being written: its pieces follow (``more``) until ``typed``."""

    def more(self, piece: str) -> None: ...

    def typed(self) -> None:
        """The turn being written is finished (its ``speech`` follows) or abandoned."""

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

    def speech(self, speaker: str, colour: str, meta: str, text: str,
               typed: str | None = None) -> None:
        if typed is None:
            self._print(f"\n{speaker} ({meta}):\n{text.strip()}")
            return
        self._print(f"({meta})")
        if text.strip() != typed.strip():  # cleaned: another speaker's lines cut, a heading
            self._print(f"kept as: {text.strip()}")

    def typing(self, speaker: str, colour: str, what: str) -> None:
        self._print(f"\n{speaker} ({what}):")

    def more(self, piece: str) -> None:
        self._out.write(piece)
        self._out.flush()

    def typed(self) -> None:
        self._print("")

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
        self._live: Any = None  # the turn being written, shown in place of the spinner
        self._writing: Any = None

    def heading(self, text: str) -> None:
        self._console.rule(text, style="dim")

    def speech(self, speaker: str, colour: str, meta: str, text: str,
               typed: str | None = None) -> None:
        # What was typed showed in a transient region: the turn is printed whole, as kept.
        from rich.text import Text

        line = Text.assemble((speaker, f"bold {colour}"), (f"  {meta}", "dim"))
        self._console.print(line)
        self._console.print(Text(text.strip()), end="\n\n")  # Text: model output is not markup

    def typing(self, speaker: str, colour: str, what: str) -> None:
        from rich.live import Live
        from rich.text import Text

        self._spinner.stop()  # one live region at a time
        self._writing = Text.assemble((speaker, f"bold {colour}"), (f"  {what}…\n", "dim"))
        self._live = Live(self._writing, console=self._console, transient=True,
                          refresh_per_second=12)
        self._live.start()

    def more(self, piece: str) -> None:
        if self._live is not None:
            self._writing.append(piece)  # appended as text, never read as markup
            self._live.update(self._writing)

    def typed(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = self._writing = None
            self._spinner.start()

    def note(self, text: str) -> None:
        from rich.text import Text

        self._console.print(Text(text))

    def status(self, text: str) -> None:
        self._spinner.update(text)

    def close(self) -> None:
        self.typed()
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
        #: Raw text of turns shown as they were written, by (round, speaker), until reported;
        #: the synthesis's, reported in the summary.
        self._typed: dict[tuple[int, str], str] = {}
        self._typed_synthesis: str | None = None
        self._colours = {
            name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(self._participants)
        }

    def _colour(self, speaker: str) -> str:
        if speaker == "judge":
            return _JUDGE_COLOUR
        return self._colours.get(speaker, _MODERATOR_COLOUR)

    def on_text(self, key: TurnKey) -> TypedTurn:
        """Where the engine writes a turn's text as the model writes it (``Debate.run``'s
        ``on_text``)."""
        return TypedTurn(self, key)

    def typing_started(self, key: TurnKey) -> None:
        if key.purpose == "synthesis":
            self.screen.heading("Synthesis")
        what = key.purpose if key.round == 0 or key.purpose == "synthesis" else f"round {key.round}"
        self.screen.typing(key.speaker, self._colour(key.speaker), what)

    def typing_ended(self, key: TurnKey, typed: str | None) -> None:
        """The turn is written (``typed``: its raw text) or abandoned (None)."""
        self.screen.typed()
        if typed is None:
            return
        if key.purpose == "synthesis":
            self._typed_synthesis = typed
        else:
            self._typed[key.round, key.speaker] = typed

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
                    0,
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
                    event.round,
                )
            case ev.TurnFailed():
                self._spoken.add(event.speaker)
                self._typed.pop((event.round, event.speaker), None)
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

    def _speech(self, speaker: str, what: str, tokens: int, duration_ms: float, text: str,
                round_number: int | None = None) -> None:
        meta = f"{what} · {tokens} tokens · {duration_ms / 1000:.1f} s"
        typed = None if round_number is None else self._typed.pop((round_number, speaker), None)
        self.screen.speech(speaker, self._colour(speaker), meta, text, typed)

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
            typed = self._typed_synthesis
            if typed is None:  # else its heading came as it was written
                screen.heading("Synthesis")
            screen.speech(self._synthesizer or "synthesis", _MODERATOR_COLOUR, "synthesis",
                          result.synthesis, typed)
        if result.verdict is not None:
            screen.heading("Verdict")
            screen.note(_verdict_text(to_builtins(result.verdict)))
        screen.heading("Outcome")
        for line in _outcome_lines(result, stop_rule):
            screen.note(line)


class TypedTurn:
    """One turn shown as the model writes it (a ``TurnText``): its pieces go to the screen, and
    its raw text to the view, which reports the finished turn against it."""

    interval_s = 0.0  # each piece printed as it comes

    def __init__(self, view: DebateView, key: TurnKey) -> None:
        self._view = view
        self._key = key
        self._parts: list[str] | None = None  # None until the first piece
        self._done = False

    def write(self, piece: str) -> None:
        if self._done:
            return
        if self._parts is None:
            self._view.typing_started(self._key)
            self._parts = []
        self._parts.append(piece)
        self._view.screen.more(piece)

    async def commit(self, text: str) -> None:
        self._end("".join(self._parts) if self._parts is not None else None)

    def discard(self) -> None:
        self._end(None)

    def _end(self, typed: str | None) -> None:
        if not self._done:
            self._done = True
            if self._parts is not None:
                self._view.typing_ended(self._key, typed)


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
