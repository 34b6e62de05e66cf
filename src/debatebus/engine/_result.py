"""What a run produces (DebateResult), what ``until`` sees (DebateState), what resume needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from debatebus._usage import ZERO_USAGE, TokenUsage
from debatebus.engine._transcript import Round, Transcript, Turn
from debatebus.exceptions import BudgetLimit
from debatebus.schemas.cost import DebateCost

if TYPE_CHECKING:
    from debatebus.engine._people import HumanTurnRecord
    from debatebus.engine._subdebates import SubDebateRecord

Status = Literal["completed", "failed"]
#: Why a debate was stopped before its protocol ended: a limit of its ``Budget`` (a final
#: failure), or a fleet-wide spend limit (``debatebus.llm._spend``: it may pass).
StopReason = BudgetLimit | Literal["spend_limit"]


@dataclass(slots=True)
class DebateResult:
    debate_id: str
    question: str
    rounds: list[Round]
    framing: str | None
    synthesis: str | None
    output: str
    status: Status
    satisfied: bool
    #: The judge's last verdict: an instance of its schema (``Verdict`` by default), or None.
    verdict: BaseModel | None
    error: str | None
    token_usage: TokenUsage
    phi_hat: float | None
    duration_ms: float
    calls: int = 0
    debate_name: str = ""
    resumed_from_round: int = 0
    #: Its sub-debates (domain, child id, who asked, status, synthesis, usage), in start order.
    sub_debates: list[SubDebateRecord] = field(default_factory=list)
    #: A failure that may pass (a provider error, a timeout…): running again may complete it.
    #: False for a completed debate and for a final failure (a budget reached).
    retryable: bool = False
    #: What stopped it, when a budget or a spend limit did (None otherwise).
    stop_reason: StopReason | None = None
    #: What it cost, its sub-debates included, when its ``prices`` priced every model it used
    #: (None otherwise: never an estimate).
    cost: DebateCost | None = None

    @property
    def transcript(self) -> Transcript:
        return Transcript(self.rounds)

    @property
    def children_usage(self) -> TokenUsage:
        """What its sub-debates spent (theirs in turn included); ``token_usage`` is its own."""
        return sum((r.usage for r in self.sub_debates), ZERO_USAGE)

    @property
    def total_usage(self) -> TokenUsage:
        return self.token_usage + self.children_usage

    @property
    def ok(self) -> bool:
        return self.status == "completed"


@dataclass(frozen=True, slots=True)
class DebateState:
    """The debate as ``until`` and callable prompts see it, after ``round`` (0 before round 1)."""

    debate_id: str
    question: str
    round: int
    rounds: Sequence[Round]
    framing: str | None
    verdict: BaseModel | None
    token_usage: TokenUsage
    calls: int

    @property
    def transcript(self) -> Transcript:
        return Transcript(self.rounds)


@dataclass(slots=True)
class Progress:
    """What a debate has committed so far: the unit of checkpointing and of resume.

    Rounds are only ever appended; ``usage``/``calls`` include every call made, committed or not,
    so budgets and accounting survive a resume. ``by_speaker`` splits ``usage`` by who made the
    calls (what prices them). ``sub_debates`` are its children, recorded when started (so a
    resumed run reuses their ids) and updated when they end. In a debate with people, ``turns``
    are the turns of rounds not yet committed, each committed as it ended, and ``people`` the
    persons' turns asked for (so a resumed run waits for the same ones).
    """

    framing: Turn | None = None
    rounds: list[Round] = field(default_factory=list)
    usage: TokenUsage = ZERO_USAGE
    calls: int = 0
    sub_debates: list[SubDebateRecord] = field(default_factory=list)
    by_speaker: dict[str, TokenUsage] = field(default_factory=dict)
    # Tuples, replaced when they grow: a debate without people allocates nothing for them.
    turns: tuple[Turn, ...] = ()
    people: tuple[HumanTurnRecord, ...] = ()
