"""Modules that moved keep their old import path for one release, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import sys

import pytest

from debatebus.engine import PRESETS
from debatebus.observability import Observer, Settlement


@pytest.mark.parametrize(("old", "name", "new"), [
    ("debatebus.observe", "Observer", Observer),
    ("debatebus.observe", "Outcome", Settlement),
    ("debatebus.presets", "PRESETS", PRESETS),
])
def test_an_old_path_warns_and_gives_the_new_object(old: str, name: str, new: object) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=old.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert getattr(module, name) is new
