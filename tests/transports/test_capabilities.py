"""Optional transport capabilities are part of the interface: callers never probe for them."""

from __future__ import annotations

import pytest

from debatebus import DebateBus
from debatebus.cli._ops_cmds import replay_range
from debatebus.client import BusClient
from debatebus.exceptions import ConfigError, NotSupportedError
from debatebus.observability._heartbeat import beat_forever, send_last_beat
from debatebus.transports import DEFAULT_BROKER, MemoryTransport, broker_url
from debatebus.transports._redis_pubsub import RedisPubSubTransport


async def test_replay_on_a_transport_without_history_says_so() -> None:
    transport = RedisPubSubTransport("redis://127.0.0.1:1/0")  # never connected
    assert transport.position_kind == "entry-id"
    with pytest.raises(NotSupportedError, match="keeps no history"):
        await replay_range(transport, "debate:request")
    assert issubclass(NotSupportedError, ConfigError)  # the CLI reports it as a usage error


async def test_memory_keeps_no_heartbeats() -> None:
    transport = MemoryTransport()
    with pytest.raises(NotSupportedError):
        await transport.write_heartbeat("g", "c", b"{}", interval_s=1.0)
    await beat_forever(transport, "g", "c", 0.01, lambda: 0)  # returns at once
    await send_last_beat(transport, "g", "c", 0.01)  # and says nothing


def test_bus_and_client_without_a_broker_follow_the_cli_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEBATEBUS_BROKER", raising=False)
    assert broker_url() == DEFAULT_BROKER == "redis://localhost:6379/0"
    assert DebateBus().broker_url == DEFAULT_BROKER
    monkeypatch.setenv("DEBATEBUS_BROKER", "memory://")
    assert DebateBus().broker_url == "memory://"
    assert isinstance(BusClient().transport, MemoryTransport)
    assert broker_url("kafka://k:9092") == "kafka://k:9092"
