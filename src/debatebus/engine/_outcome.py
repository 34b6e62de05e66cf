"""What a protocol hands back once its rounds are played; the debate folds it into the result."""

from __future__ import annotations

from dataclasses import dataclass

from debatebus.engine._definition import Participant
from debatebus.llm._base import Message


@dataclass(frozen=True, slots=True)
class SynthesisCall:
    """The synthesis a protocol asks for: who writes it, in which round, with which prompt."""

    writer: Participant
    round: int
    prompt: Message


@dataclass(frozen=True, slots=True)
class Outcome:
    """A protocol's decisions: whether its stop rule was met, Φ̂, a sole survivor's text (which is
    then the output), and the synthesis still to write, if any."""

    satisfied: bool
    phi_hat: float | None = None
    sole_output: str | None = None
    synthesis: SynthesisCall | None = None
