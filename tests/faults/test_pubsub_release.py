"""Redis pub/sub keeps no copy of a message, so a worker that cannot settle one hands it back to
itself: after a delay growing with its deliveries, so a Synkro claim failing for a couple of
seconds (a Redis hiccup) does not burn through ``max_deliveries`` and dead-letter a healthy
request."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from tests.support.bus import make_debate, running

from debatebus._backoff import redelivery_delay
from debatebus._worker import DebateBus
from debatebus.client import BusClient
from debatebus.exceptions import TransportError
from debatebus.transports import Delivery
from debatebus.transports._synkro import SynkroDialect

pytestmark = pytest.mark.redis


async def test_a_claim_failing_for_two_seconds_does_not_dead_letter_the_request(
        redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url = redis_server.url.replace("redis://", "redis+pubsub://")
    event_type = f"debate:hiccup{uuid.uuid4().hex[:6]}"
    claim = SynkroDialect.claim
    failing_until = 0.0
    attempts: list[int] = []

    async def flaky_claim(self: SynkroDialect, delivery: Delivery, request_id: str) -> bool:
        attempts.append(delivery.deliveries)
        if time.monotonic() < failing_until:
            raise TransportError("Redis hiccup: the claim could not be made")
        return await claim(self, delivery, request_id)

    monkeypatch.setattr(SynkroDialect, "claim", flaky_claim)
    app = DebateBus(url, heartbeat_interval_s=None, max_deliveries=5)
    app.subscribe(event_type, make_debate().as_handler(durable=False))
    async with running(app), BusClient(url) as client:
        failing_until = time.monotonic() + 2.0
        result = await client.request(event_type, {"input": "Tabs or spaces?"}, timeout=20)
    assert result.payload["debateStatus"] == "completed"
    assert 2 <= len(attempts) <= 5, attempts  # retried, and well within max_deliveries
    assert attempts == list(range(1, len(attempts) + 1))


def test_redeliveries_wait_longer_each_time() -> None:
    for deliveries, low, high in ((1, 0.25, 0.5), (2, 0.5, 1.0), (4, 2.0, 4.0), (30, 15.0, 30.0)):
        waits = [redelivery_delay(deliveries) for _ in range(200)]
        assert all(low <= w <= high for w in waits), (deliveries, min(waits), max(waits))
