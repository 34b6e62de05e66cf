"""Synkro's dialect without a broker: how results, failures and events are shaped, the keys and
the settings. The fixtures are written from Synkro's documented shapes (its handler registry,
``executeHandler`` and debate ``asHandler``), not copied from its code."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from debatebus.exceptions import ConfigError
from debatebus.handlers._contract import HandlerResult
from debatebus.schemas.envelope import Envelope
from debatebus.transports._dialect import DEBATEBUS_WIRE
from debatebus.transports._synkro import (
    SYNKRO_DEFAULTS,
    SynkroDialect,
    SynkroSettings,
    dedupe_key,
    dlq_key,
    lock_key,
    metrics_key,
    step_channel,
    tracks_metrics,
)

#: How Synkro's Redis subscriber reads a message's requestId before it dedupes per channel.
SYNKRO_REQUEST_ID = re.compile(r'"requestId":"([^"]+)"')


def _no_redis() -> Any:
    raise AssertionError("shaping results must not touch Redis")


DIALECT = SynkroDialect(SYNKRO_DEFAULTS, _no_redis)


def transcript(*rounds: list[tuple[str, str, bool]]) -> list[dict[str, Any]]:
    return [{"number": n, "phase": "rebuttal", "turns": [
        {"speaker": s, "round": n, "text": t, "failed": f, "error": "down" if f else None}
        for s, t, f in turns]} for n, turns in enumerate(rounds, 1)]


def debate_fields(**overrides: Any) -> dict[str, Any]:
    fields = {"input": "Adopt Kafka?", "team": "core", "debateId": "r-1", "debateOutput": "",
              "debateSynthesis": None, "debateRounds": 2, "debateStatus": "completed",
              "debateTokenUsage": {"promptTokens": 3, "completionTokens": 4, "totalTokens": 7},
              "debateTranscript": transcript([("alice", "first", False)],
                                             [("alice", "Yes.", False), ("bob", "x", True),
                                              ("carol", "No.", False)]),
              "debateError": None, "debateReplayed": False}
    return {**fields, **overrides}


def test_a_debate_without_synthesis_outputs_the_last_rounds_texts_and_no_synthesis_key() -> None:
    result = DIALECT.answered(HandlerResult("completed", debate_fields(
        debateOutput="alice: Yes.\ncarol: No.")))
    assert result.status == "completed"
    assert result.fields["debateOutput"] == "Yes.\n\nNo."  # the failed turn is left out
    assert "debateSynthesis" not in result.fields
    assert result.fields["team"] == "core"  # passed-through fields and extras stay
    assert result.fields["debateTranscript"][-1]["turns"][0]["speaker"] == "alice"


def test_a_synthesis_is_kept_and_is_the_output() -> None:
    result = DIALECT.answered(HandlerResult("completed", debate_fields(
        debateSynthesis="Adopt it.", debateOutput="Adopt it.")))
    assert result.fields["debateSynthesis"] == "Adopt it."
    assert result.fields["debateOutput"] == "Adopt it."


def test_a_failed_debate_completes_saying_the_llm_call_failed() -> None:
    result = DIALECT.answered(HandlerResult("failed", debate_fields(
        debateStatus="failed", debateError="every participant failed in round 1: model down")))
    assert result.status == "completed"  # Synkro's handler returned: the workflow goes on
    assert result.fields["debateStatus"] == "failed"
    assert result.fields["debateOutput"] == (
        "LLM call failed: every participant failed in round 1: model down")
    assert "debateSynthesis" not in result.fields


def test_a_plain_handlers_fields_are_left_as_they_are() -> None:
    result = DIALECT.answered(HandlerResult("completed", {"answer": 42}))
    assert result == HandlerResult("completed", {"answer": 42})


def failure_envelope(payload: dict[str, Any]) -> Envelope:
    return Envelope(request_id="r-9", payload=payload, type="event:debate:request:failed",
                    correlation_id="c-1", causation_id="r-9", timestamp="2026-01-01T00:00:00.000Z",
                    headers={"traceparent": "00-a-b-01"})


@pytest.mark.parametrize("original", ["just a string", [1, 2], 7, None, {"input": 42},
                                      {"input": 42, "debateStatus": "kept as sent"}])
def test_bad_input_fails_with_errors_and_the_original_payload_whatever_its_type(
        original: Any) -> None:
    request = json.dumps({"requestId": "r-9", "payload": original}).encode()
    failure = {"debateError": "payload.input must be a string", "debateStatus": "failed"}
    body = DIALECT.result_body(request, failure_envelope(
        {**failure, "debateSynthesis": None, "debatePayloadTruncated": {"bytes": 1}}), True)
    event = json.loads(body)
    assert event["requestId"] == "r-9"
    if isinstance(original, dict):  # its keys untouched; the failure fields it lacks beside them
        assert event["payload"] == {**failure, **original}
    else:
        assert event["payload"] == original
    assert event["errors"] == [{"message": "payload.input must be a string", "name": "InputError"}]
    assert event["correlationId"] == "c-1" and event["headers"] == {"traceparent": "00-a-b-01"}
    match = SYNKRO_REQUEST_ID.search(body.decode())
    assert match is not None and match.group(1) == "r-9"


def test_a_request_without_payload_fails_without_one() -> None:
    body = DIALECT.result_body(b'{"requestId": "r-9"}', failure_envelope({"debateError": "x"}),
                               True)
    assert "payload" not in json.loads(body)


def test_a_completed_body_is_the_envelope() -> None:
    envelope = failure_envelope({"debateOutput": "ok"})
    assert DIALECT.result_body(b"", envelope, False) == DEBATEBUS_WIRE.result_body(
        b"", envelope, False)
    assert json.loads(DIALECT.result_body(b"", envelope, False))["payload"] == {
        "debateOutput": "ok"}


def test_each_event_has_its_own_request_id_and_its_fields_under_payload() -> None:
    event = b'{"type":"round_started","debateId":"d","requestId":"r-1","seq":3}'
    body = DIALECT.event_body("r-1", 3, event)
    message = json.loads(body)
    assert message == {"requestId": "r-1:3", "payload": json.loads(event)}
    match = SYNKRO_REQUEST_ID.search(body.decode())
    assert match is not None and match.group(1) == "r-1:3"  # what Synkro dedupes by
    assert DEBATEBUS_WIRE.event_body("r-1", 3, event) == event


def test_debatebus_rules_leave_results_alone() -> None:
    result = HandlerResult("failed", debate_fields(debateStatus="failed"))
    assert DEBATEBUS_WIRE.answered(result) is result


def test_keys_and_channels_are_synkros() -> None:
    assert lock_key("r-1", "debate:request") == "synkro:lock:handler:r-1:debate:request"
    assert dedupe_key("r-1", "debate:request") == "synkro:dedupe:handler:r-1:debate:request"
    assert metrics_key("debate:request", "failed") == "synkro:metrics:debate:request:failed"
    assert dlq_key("debate:request") == "synkro:dlq:debate:request"
    assert step_channel("debateFlow", "debate:request") == "workflow:debateFlow:debate:request"
    assert tracks_metrics("debate:request")
    assert not tracks_metrics("workflow:debateFlow:debate:request")


def test_settings_default_to_synkros_retention_and_refuse_nonsense() -> None:
    assert (SYNKRO_DEFAULTS.lock_ttl_s, SYNKRO_DEFAULTS.dedupe_ttl_s) == (300, 86400)
    assert SYNKRO_DEFAULTS.metrics_ttl_s is None
    for bad in ({"lock_ttl_s": 0}, {"dedupe_ttl_s": -1}, {"metrics_ttl_s": 1.5},
                {"lock_ttl_s": True}):
        with pytest.raises(ConfigError, match="whole number of seconds"):
            SynkroSettings(**bad)
    with pytest.raises(ConfigError):
        step_channel("", "debate:request")
