"""Ready panels: ``Debate.from_preset("starter_trio", llm=...)``, ``debatebus run "…" --preset
starter_trio``, or ``payload.preset`` on a worker whose handler allows it
(``as_handler(presets=["starter_trio"])``).

- ``starter_trio``: an optimist, a skeptic and a pragmatist in round-robin, hosted by a moderator
  who frames the question and writes the synthesis.
- ``product_decision``: five specialists in cross-pollination, each with an explicit utility
  (what it maximizes and penalizes), and a synthesis in tensions, equilibrium and answer.
- ``code_review``: four reviewers in cross-pollination; the synthesis lists blocking issues,
  suggestions and a verdict.

The personas and prompts are in English; ``language="es"`` still puts every shipped prompt
around them in Spanish.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from debatebus.engine._definition import DebateSpec, Participant, Protocol, Utility
from debatebus.engine._prompts import SynthesisSections
from debatebus.exceptions import ConfigError
from debatebus.llm._base import LLM


@dataclass(frozen=True, slots=True)
class Preset:
    """A panel and how it debates; ``Debate.from_preset(name, llm=…)`` makes it a ``Debate``."""

    name: str
    description: str
    participants: tuple[Participant, ...]
    protocol: Protocol
    moderator: Participant | None = None
    max_rounds: int = 3
    synthesis_sections: SynthesisSections | None = None
    word_limits: Mapping[str, int] | None = None

    def arguments(self, llm: LLM | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """This panel's ``Debate`` arguments on ``llm``, ``overrides`` replacing any of them."""
        unknown = sorted(set(overrides) - _DEBATE_ARGUMENTS)
        if unknown:
            raise ConfigError(f"preset {self.name!r} got unknown Debate arguments {unknown}: use "
                              f"any of {sorted(_DEBATE_ARGUMENTS)}")
        return {
            "name": self.name,
            "participants": self.participants,
            "llm": llm,
            "protocol": self.protocol,
            "moderator": self.moderator,
            "max_rounds": self.max_rounds,
            "synthesis_sections": self.synthesis_sections,
            "word_limits": self.word_limits,
            **overrides,
        }


_DEBATE_ARGUMENTS = frozenset(f.name for f in fields(DebateSpec) if f.init)

STARTER_TRIO = Preset(
    name="starter_trio",
    description="an optimist, a skeptic and a pragmatist, hosted by a neutral moderator",
    participants=(
        Participant("optimist", "You look for what could go right. Argue for the most promising "
                    "path: name the concrete upside and how to reach it, without bending facts."),
        Participant("skeptic", "You look for what could go wrong. Test every claim, name the "
                    "concrete risks, costs and hidden assumptions, and say what evidence would "
                    "change your mind."),
        Participant("pragmatist", "You look for what can be done next. Weigh upside against "
                    "risk and propose a workable plan: its first step and what to measure."),
    ),
    protocol="round-robin",
    moderator=Participant("host", "You host debates neutrally: you frame the question, then "
                          "write a fair synthesis that credits each side."),
    max_rounds=2,
    synthesis_sections=("agreement", "tensions", "answer"),
    word_limits={"framing": 80, "opening": 120, "rebuttal": 120, "synthesis": 250},
)

PRODUCT_DECISION = Preset(
    name="product_decision",
    description="five product specialists with explicit utilities, weighed into an equilibrium",
    participants=(
        Participant(
            "customer_advocate",
            "You speak for the people who would use the product: their jobs to be done, their "
            "frustrations and what they would pay for.",
            utility=Utility(
                maximizes="value delivered to users and the share of them who adopt it",
                penalizes="friction, confusion and anything that costs users' trust",
            ),
        ),
        Participant(
            "engineering_lead",
            "You lead the team that would build and run it, and know what it takes to ship, "
            "operate and change it.",
            utility=Utility(
                maximizes="delivery confidence and a codebase the team can keep changing",
                penalizes="unplanned complexity, new operational burden and debt taken on blindly",
            ),
        ),
        Participant(
            "finance_partner",
            "You own the budget and the business case.",
            utility=Utility(
                maximizes="return on the investment within a year, with costs known up front",
                penalizes="open-ended spending and benefits nobody can measure",
            ),
        ),
        Participant(
            "security_officer",
            "You answer for security, privacy and compliance.",
            utility=Utility(
                maximizes="protection of user data and the company's regulatory standing",
                penalizes="new attack surface, data kept without need and unreviewed vendors",
            ),
        ),
        Participant(
            "market_strategist",
            "You watch competitors, customers' alternatives and the timing of the market.",
            utility=Utility(
                maximizes="market position and how fast the company learns from real customers",
                penalizes="missed windows and bets that teach nothing",
            ),
        ),
    ),
    protocol="cross-pollination",
    synthesis_sections=("tensions", "equilibrium", "answer"),
)

CODE_REVIEW = Preset(
    name="code_review",
    description="four reviewers (correctness, security, maintainability, performance)",
    participants=(
        Participant(
            "correctness_reviewer",
            "You review code for correctness: logic errors, edge cases, error handling, "
            "concurrency, and whether the tests would catch a regression.",
            utility=Utility(maximizes="code that does what it claims on every input",
                            penalizes="untested paths and failures that pass silently"),
        ),
        Participant(
            "security_reviewer",
            "You review code as an attacker would read it: input handling, authentication, "
            "authorization, secrets and dependencies.",
            utility=Utility(maximizes="safety against hostile input and leaked secrets",
                            penalizes="injection, unchecked input, weak access control and "
                            "secrets in code or logs"),
        ),
        Participant(
            "maintainability_reviewer",
            "You review code for the next person who changes it: naming, structure, "
            "duplication, coupling and documentation.",
            utility=Utility(maximizes="code a newcomer can read and change safely",
                            penalizes="cleverness, duplication and hidden coupling"),
        ),
        Participant(
            "performance_reviewer",
            "You review code for its cost at the expected scale: algorithms, I/O, memory and "
            "work on hot paths.",
            utility=Utility(maximizes="predictable latency and resource use at the expected scale",
                            penalizes="needless work on hot paths and unbounded growth"),
        ),
    ),
    protocol="cross-pollination",
    synthesis_sections=(
        "Blocking issues (what must change before merging, each with where and why); then "
        "Suggestions (worth doing, not blocking); then Verdict (approve, approve with changes, or "
        "request changes) with one sentence of why."
    ),
)

PRESETS: Mapping[str, Preset] = {p.name: p for p in (STARTER_TRIO, PRODUCT_DECISION, CODE_REVIEW)}


def preset(name: str) -> Preset:
    """The preset called ``name``; ConfigError lists the others."""
    found = PRESETS.get(name)
    if found is None:
        raise ConfigError(f"unknown preset {name!r}: use one of {list(PRESETS)}")
    return found
