"""What metrics, traces and logs all need to know about debate events: which ones report a call."""

from __future__ import annotations

from typing import Final

from debatebus.schemas import events as ev

CallEvent = (ev.FramingCompleted | ev.TurnCompleted | ev.TurnFailed | ev.VerdictReached
             | ev.SynthesisCompleted)

#: Each call event and the purpose it is labelled with. Turns carry no protocol phase, so every
#: participant turn (opening, rebuttal…) is one purpose: "turn".
CALL_PURPOSES: Final[dict[type[CallEvent], str]] = {
    ev.FramingCompleted: "framing",
    ev.TurnCompleted: "turn",
    ev.TurnFailed: "turn",
    ev.VerdictReached: "judge",
    ev.SynthesisCompleted: "synthesis",
}

#: A label value must not be empty-ambiguous: fakes and older engines report no model name.
UNKNOWN_MODEL: Final = "unknown"


def model_of(event: CallEvent) -> str:
    return event.model or UNKNOWN_MODEL


def call_round(event: CallEvent) -> int | None:
    """The round a call belongs to; framing and synthesis happen outside any round."""
    if isinstance(event, ev.TurnCompleted | ev.TurnFailed | ev.VerdictReached):
        return event.round
    return None
