"""A fleet's worker serving the world's debate (tests/evaluation/world.py): ``debatebus worker
tests.evaluation.fleet_app:app`` with ``DBB_BROKER``, ``DBB_EVENT_TYPE`` and ``DBB_GROUP``."""

from __future__ import annotations

import os

from tests.evaluation.world import world_debate

from debatebus._worker import DebateBus

app = DebateBus(os.environ["DBB_BROKER"], group=os.environ["DBB_GROUP"])
app.subscribe(os.environ["DBB_EVENT_TYPE"], world_debate().as_handler())
