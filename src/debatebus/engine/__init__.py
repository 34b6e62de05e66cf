"""The pure debate engine: definitions, protocols, transcript, judge and Φ̂. No I/O here."""

from debatebus.engine._debate import Debate, DebateMetrics
from debatebus.engine._definition import (
    Budget,
    HumanParticipant,
    Judge,
    Participant,
    Utility,
    Verdict,
)
from debatebus.engine._phi import compute_phi_hat, interpret_phi_hat, tokenize
from debatebus.engine._prompts import PROTOCOL_VERSION, Prompts
from debatebus.engine._result import DebateResult, DebateState, Progress, StopReason
from debatebus.engine._run import TurnKey
from debatebus.engine._subdebates import SubDebates
from debatebus.engine._templates import PromptContext
from debatebus.engine._transcript import Round, Transcript, Turn

__all__ = [
    "PROTOCOL_VERSION",
    "Budget",
    "Debate",
    "DebateMetrics",
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
    "SubDebates",
    "Transcript",
    "Turn",
    "TurnKey",
    "Utility",
    "Verdict",
    "compute_phi_hat",
    "interpret_phi_hat",
    "tokenize",
]
