"""The handler contract: every handler is called as ``handle(payload, ctx)``; plain functions are
adapted once, at subscribe."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from debatebus import DebateBus
from debatebus.exceptions import ConfigError
from debatebus.handlers import BusHandler, HandlerContext, HandlerResult
from debatebus.testing import DebateTestBus
from debatebus.transports import MemoryTransport


class Echo:
    """A BusHandler that is not callable: what it is given shows up in its result."""

    def __init__(self) -> None:
        self.seen: list[HandlerContext] = []

    async def handle(self, payload: Mapping[str, Any], ctx: HandlerContext) -> HandlerResult:
        self.seen.append(ctx)
        status = "failed" if payload.get("fail") else "completed"
        return HandlerResult(status, {**payload, "debateStatus": status, "seenBy": ctx.request_id})


async def test_a_bus_handler_gets_the_context_and_its_status_picks_the_topic() -> None:
    echo = Echo()
    assert isinstance(echo, BusHandler)
    async with DebateTestBus(echo) as bus:
        done = await bus.request({"input": "x"}, request_id="r-1")
        failed = await bus.request({"input": "y", "fail": True}, request_id="r-2")
    assert done.type == "event:debate:request:completed" and done.payload["seenBy"] == "r-1"
    assert failed.type == "event:debate:request:failed" and failed.payload["seenBy"] == "r-2"
    assert [ctx.request_id for ctx in echo.seen] == ["r-1", "r-2"]
    assert echo.seen[0].delivery.topic == "debate:request"
    assert echo.seen[0].delivery.deliveries == 1


async def test_a_plain_handler_is_adapted_once_and_keeps_its_fields() -> None:
    async def plain(payload: Mapping[str, Any]) -> Mapping[str, Any]:
        return {**payload, "debateStatus": "failed" if payload.get("fail") else "completed"}

    async with DebateTestBus(plain) as bus:
        done = await bus.request({"input": "x", "team": "core"})
        failed = await bus.request({"input": "y", "fail": True})
    assert done.type.endswith(":completed") and done.payload["team"] == "core"
    assert failed.type.endswith(":failed")


def test_subscribe_refuses_what_is_neither() -> None:
    app = DebateBus(MemoryTransport())
    with pytest.raises(ConfigError, match="async callable or have an async handle"):
        app.subscribe("debate:request", object())  # type: ignore[arg-type]
    assert app.handlers() == {}
    app.subscribe("debate:request", Echo())
    assert list(app.handlers()) == ["debate:request"]
