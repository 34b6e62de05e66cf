"""The worker app ``test_worker_cli`` serves: the bus debate, configured by environment variables."""

from __future__ import annotations

import os

from tests.support.bus import make_debate, transport_options

from debatebus._worker import DebateBus


def app() -> DebateBus:
    url = os.environ["DBB_BROKER"]
    bus = DebateBus(url, group=os.environ["DEBATEBUS_GROUP"], transport_options=transport_options(url),
                    heartbeat_interval_s=0.5)
    bus.subscribe(os.environ["DBB_EVENT_TYPE"], make_debate().as_handler())
    return bus
