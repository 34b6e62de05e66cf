"""What a debate cost in money, as results, events and checkpoints carry it (``debateCost``)."""

from __future__ import annotations

import msgspec

__all__ = ["DebateCost"]


class DebateCost(msgspec.Struct, frozen=True, rename="camel"):
    """What a debate cost: ``total`` = its own calls (by speaker in ``participants``) plus its
    sub-debates' (``children``, their own children included), in ``currency``, at prices dated
    ``prices_as_of``. Built by ``debatebus._pricing.Prices.debate_cost``."""

    currency: str
    total: float
    participants: dict[str, float]
    children: float = 0.0
    prices_as_of: str | None = None
