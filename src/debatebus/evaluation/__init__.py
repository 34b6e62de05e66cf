"""Does the debate pay? ``Evaluation`` runs a dataset through several arms (one call, a vote at
equal compute, debates, a fleet) and reports each arm's accuracy with its interval, paired tests
against the baselines, and what it spent. ``debatebus eval`` is its command line; see
docs/evaluation.md."""

from debatebus.evaluation._arms import (
    Answer,
    Arm,
    Ask,
    DebateArm,
    FleetArm,
    HandlerArm,
    Single,
    Vote,
    majority,
    read_result,
    solver_debate,
)
from debatebus.evaluation._datasets import Dataset, Item, arithmetic, gsm8k, jsonl
from debatebus.evaluation._graders import (
    ExactGrader,
    Grader,
    JudgeGrader,
    NumericGrader,
    RegexGrader,
    extract_number,
)
from debatebus.evaluation._report import ArmSummary, ItemResult, Paired, Report
from debatebus.evaluation._runner import Evaluation, Progress
from debatebus.evaluation._statistics import Interval, mcnemar_exact, wilson_interval

__all__ = [
    "Answer",
    "Arm",
    "ArmSummary",
    "Ask",
    "Dataset",
    "DebateArm",
    "Evaluation",
    "ExactGrader",
    "FleetArm",
    "Grader",
    "HandlerArm",
    "Interval",
    "Item",
    "ItemResult",
    "JudgeGrader",
    "NumericGrader",
    "Paired",
    "Progress",
    "RegexGrader",
    "Report",
    "Single",
    "Vote",
    "arithmetic",
    "extract_number",
    "gsm8k",
    "jsonl",
    "majority",
    "mcnemar_exact",
    "read_result",
    "solver_debate",
    "wilson_interval",
]
