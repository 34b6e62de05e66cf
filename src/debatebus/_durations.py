"""Durations as people write them: seconds (``3600``) or a number with a unit (``90s``,
``30m``, ``12h``, ``7d``). Retentions in URLs (``debatebus._retention``) and ``debatebus failures
--since`` read them."""

from __future__ import annotations

import math
from typing import Final

_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> float | None:
    """The seconds ``text`` says, or None unless it is a duration > 0 and finite."""
    value = text.strip().lower()
    scale = _UNITS.get(value[-1:], 0)
    try:
        seconds = float(value[:-1] if scale else value) * (scale or 1)
    except ValueError:
        return None
    return seconds if seconds > 0 and math.isfinite(seconds) else None
