"""Markers follow the brokers a test starts: ``redis`` for a redis-server or Redis Cluster,
``kafka`` for Tansu.

The root conftest marks each collected test from the fixtures it takes (``BROKER_FIXTURES``) and
from the broker its parametrized fixtures pick (a parameter named ``redis…`` or ``kafka…``, such
as the transport kinds ``redis_streams-resp2`` and ``kafka``). A test that starts a broker some
other way carries the marker by hand; ``require`` makes a forgotten one fail loudly where the
broker starts, instead of only breaking ``-m "not redis"`` runs on machines without the binary.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: The fixtures that start (or hand out) a broker, and the marker each implies.
BROKER_FIXTURES = {
    "redis_server": "redis",
    "redis_cluster": "redis",
    "redis_url": "redis",
    "fault_redis": "redis",
    "tansu_server": "kafka",
    "fault_tansu": "kafka",
}

_BROKER_PARAM = re.compile(r"(redis|kafka)(?![a-z])")

#: The markers of the test now being set up or run (None outside pytest, e.g. in benchmarks).
running: set[str] | None = None


def broker_markers(fixturenames: Iterable[str], params: dict[str, object]) -> set[str]:
    """The broker markers a test with these fixtures and fixture parameters must carry."""
    marks = {BROKER_FIXTURES[name] for name in fixturenames if name in BROKER_FIXTURES}
    for value in params.values():
        if isinstance(value, str) and "://" not in value and (found := _BROKER_PARAM.match(value)):
            marks.add(found.group(1))
    return marks


def require(marker: str, what: str) -> None:
    """Refuse to start ``what`` in a test that does not carry ``marker``."""
    if running is not None and marker not in running:
        raise RuntimeError(f"{what} started by a test without the {marker!r} marker: take the "
                           f"broker's fixture (tests/support/markers.py lists them) or mark the "
                           f"test @pytest.mark.{marker}")
