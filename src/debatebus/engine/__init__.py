"""The pure debate engine: definitions, protocols, transcript, judge and Φ̂. No I/O here."""

from debatebus.engine.debate import Debate
from debatebus.engine.definition import (
    Budget,
    HumanParticipant,
    Judge,
    Participant,
    Utility,
    Verdict,
)
from debatebus.engine.phi import compute_phi_hat, interpret_phi_hat, tokenize
from debatebus.engine.prompts import PROTOCOL_VERSION, Prompts
from debatebus.engine.result import DebateResult, DebateState, Progress, StopReason
from debatebus.engine.templates import PromptContext
from debatebus.engine.transcript import Round, Transcript, Turn

__all__ = [
    "PROTOCOL_VERSION",
    "Budget",
    "Debate",
    "DebateResult",
    "DebateState",
    "HumanParticipant",
    "Judge",
    "Participant",
    "Progress",
    "PromptContext",
    "Prompts",
    "Round",
    "StopReason",
    "Transcript",
    "Turn",
    "Utility",
    "Verdict",
    "compute_phi_hat",
    "interpret_phi_hat",
    "tokenize",
]
