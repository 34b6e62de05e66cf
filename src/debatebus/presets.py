"""Deprecated: the ready panels moved to ``debatebus.engine`` (``Debate.from_preset``
builds them). This alias warns, and goes in the next release."""

from __future__ import annotations

import warnings

from debatebus.engine._presets import PRESETS, Preset, preset

__all__ = ["PRESETS", "Preset", "preset"]

warnings.warn("debatebus.presets is deprecated: import PRESETS, Preset and preset from "
              "debatebus.engine", DeprecationWarning, stacklevel=2)
