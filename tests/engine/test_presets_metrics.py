"""``on_metrics``: called once per run with Φ̂, the agents that spoke and the duration; on a bus
the same figures are in the result and in Prometheus."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from debatebus import Debate, Participant
from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.engine._debate import DebateMetrics
from debatebus.exceptions import LLMError
from debatebus.observability._metrics import PrometheusObserver
from debatebus.testing import DebateTestBus

NAMES = ("alice", "bob", "carol")


def people() -> list[Participant]:
    return [Participant(n, f"You are {n}.") for n in NAMES]


async def test_on_metrics_is_called_once_with_the_results_figures(make_stage):
    # carol fails her position, so she is not among the agents; alice and bob are.
    stage = make_stage(failures={("carol", "position", 1): LLMError("down")},
                       replies={("alice", "revision", 2): "alice changed her mind entirely"})
    seen: list[DebateMetrics] = []
    debate = Debate("m", people(), llm=stage.llm, protocol="cross-pollination",
                    on_metrics=seen.append)
    result = await debate.run("t", debate_id="d-7")

    assert result.ok and result.phi_hat is not None and 0 < result.phi_hat <= 1
    assert seen == [DebateMetrics("d-7", "m", "completed", result.phi_hat, ("alice", "bob"),
                                  result.duration_ms)]
    assert result.duration_ms > 0


async def test_an_async_on_metrics_is_awaited_and_a_failed_run_reported(make_stage):
    stage = make_stage(failures={(n, "opening", 1): LLMError("down") for n in NAMES})
    seen: list[DebateMetrics] = []

    async def record(metrics: DebateMetrics) -> None:
        await asyncio.sleep(0)
        seen.append(metrics)

    result = await Debate("f", people(), llm=stage.llm, on_metrics=record).run("t")
    assert result.status == "failed"
    assert [(m.status, m.phi_hat, m.agents) for m in seen] == [("failed", None, ())]


@pytest.mark.parametrize("durable", [False, True])
async def test_on_the_bus_the_result_and_prometheus_carry_the_same_figures(make_stage, durable):
    stage = make_stage(replies={("bob", "revision", 2): "bob now backs a pilot first"})
    seen: list[DebateMetrics] = []
    debate = Debate("bus", people(), llm=stage.llm, protocol="cross-pollination",
                    on_metrics=seen.append)
    registry = CollectorRegistry()
    handler = debate.as_handler(durable=durable)
    if durable:
        handler.use_default_store(MemoryCheckpointStore())
    async with DebateTestBus(handler) as bus:
        bus.app.add_observer(PrometheusObserver(registry=registry))
        result = await bus.request("t", request_id="r-1")
        if durable:  # the stored result, replayed: no run, no second report
            replay = await bus.request({"input": "t", "debateId": "r-1"})

    (metrics,) = seen
    payload = result.payload
    assert payload["debatePhiHat"] == metrics.phi_hat
    assert payload["debateAgents"] == list(metrics.agents) == list(NAMES)
    assert payload["debateDurationMs"] == metrics.duration_ms
    if durable:
        assert replay.payload["debateReplayed"] is True
        assert replay.payload["debateAgents"] == list(NAMES)

    def sample(name: str) -> float | None:
        return registry.get_sample_value(name, {"event_type": "debate:request"})

    assert sample("debatebus_debate_phi_hat_count") == 1  # a replay is not counted again
    assert sample("debatebus_debate_phi_hat_sum") == pytest.approx(metrics.phi_hat)
    assert sample("debatebus_debate_agents_sum") == 3
