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
from debatebus.engine._presets import PRESETS, Preset, preset
from debatebus.engine._prompts import PROTOCOL_VERSION, Prompts
from debatebus.engine._result import DebateResult, DebateState, Progress, StopReason
from debatebus.engine._run import TurnKey, TurnText
from debatebus.engine._subdebates import SubDebates
from debatebus.engine._templates import PromptContext
from debatebus.engine._transcript import Round, Transcript, Turn

__all__ = [
    "PRESETS",
    "PROTOCOL_VERSION",
    "Budget",
    "Debate",
    "DebateMetrics",
    "DebateResult",
    "DebateState",
    "HumanParticipant",
    "Judge",
    "Participant",
    "Preset",
    "Progress",
    "PromptContext",
    "Prompts",
    "Round",
    "StopReason",
    "SubDebates",
    "Transcript",
    "Turn",
    "TurnKey",
    "TurnText",
    "Utility",
    "Verdict",
    "compute_phi_hat",
    "interpret_phi_hat",
    "preset",
    "tokenize",
]
