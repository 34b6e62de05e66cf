"""Secrets in a model's base URL (user:password, ``?api_key=``) reach no output: not a failed
turn's error, an event, a result, a failure event, ``debate:events`` nor the checkpoint store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from debatebus._worker import DebateBus
from debatebus.checkpoints import store_from_url
from debatebus.client import BusClient
from debatebus.engine import Debate, Participant
from debatebus.exceptions import LLMError
from debatebus.handlers._results import failure_fields, result_fields, to_builtins
from debatebus.llm import FunctionLLM, LLMRequest, OpenAICompatibleLLM, model_name, resolve_llm
from debatebus.llm._retry import RetryPolicy
from debatebus.schemas.events import DebateEvent
from tests.llm.servers import FakeAPI, Reply

PASSWORD = "Pw0rdSecret"
KEY = "KeyS3cretValue"
SECRETS = (PASSWORD, KEY)


def secret_url(base: str) -> str:
    host = base.removeprefix("http://")
    return f"http://user:{PASSWORD}@{host}/v1?api_key={KEY}"


def assert_clean(*things: Any) -> None:
    text = json.dumps(to_builtins(list(things)), default=str)
    for secret in SECRETS:
        assert secret not in text


async def no_sleep(seconds: float) -> None:
    pass


def failing_provider(url: str, *, timeout: float = 5.0) -> OpenAICompatibleLLM:
    policy = RetryPolicy(max_retries=1, timeout=timeout, total_timeout=10.0, sleep=no_sleep)
    return OpenAICompatibleLLM("gpt-test", base_url=url, retry_policy=policy)


def leaky_function(url: str) -> FunctionLLM:
    def call(request: LLMRequest) -> str:
        raise LLMError(f"cannot reach {url}: connection refused")

    return FunctionLLM(call, model="fn")


def debate(llm: Any) -> Debate:
    return Debate("leaks", [Participant("a", "Argue for."), Participant("b", "Argue against.")],
                  llm=llm, max_rounds=1)


async def run_and_collect(llm: Any) -> tuple[list[DebateEvent], dict[str, Any]]:
    events: list[DebateEvent] = []
    result = await debate(llm).run("Should we?", on_event=events.append)
    assert result.status == "failed" or any(t.failed for r in result.rounds for t in r.turns)
    return events, result_fields(result)


@pytest.mark.parametrize("reply", [
    Reply(500, {"error": {"message": "boom"}}),
    Reply(401, {"error": {"message": "bad key"}}),
    Reply(200, delay=2.0),  # hangs past the attempt's timeout
])
async def test_provider_failures_carry_no_secret(fake_api: FakeAPI, reply: Reply) -> None:
    fake_api.plan(*[reply] * 8)
    llm = failing_provider(secret_url(fake_api.url), timeout=0.5)
    events, fields = await run_and_collect(llm)
    errors = [getattr(e, "error", None) for e in events if getattr(e, "error", None)]
    assert errors, "the provider's failure must show up as failed turns"
    assert_clean(events, fields, errors, repr(llm))
    assert fake_api.requests, "the calls reached the fault server"


async def test_an_unreachable_server_is_named_without_its_secrets(fake_api: FakeAPI) -> None:
    llm = failing_provider(secret_url("http://127.0.0.1:9"))  # discard port: refused
    with pytest.raises(LLMError) as info:
        await llm.complete(LLMRequest("system", ()))
    message = str(info.value)
    assert "cannot reach http://user:***@127.0.0.1:9/v1" in message
    assert_clean(message, repr(info.value.__cause__), repr(info.value.__cause__.__context__))


async def test_a_function_llm_error_quoting_the_url_is_redacted() -> None:
    events, fields = await run_and_collect(leaky_function(secret_url("http://h:1")))
    assert any("user:***@h:1" in str(getattr(e, "error", "")) for e in events)
    assert_clean(events, fields)


def test_failure_fields_redact_as_a_safety_net() -> None:
    fields = failure_fields("d-1", f"model at {secret_url('http://h:1')} said no")
    assert "user:***@h:1" in fields["debateError"]
    assert_clean(fields)


def test_the_model_label_of_a_model_string_never_holds_the_url() -> None:
    llm = resolve_llm(f"openai:gpt-test@{secret_url('http://127.0.0.1:9')}")
    assert model_name(llm) == "gpt-test"
    assert_clean(repr(llm))


async def test_nothing_a_bus_run_writes_holds_a_secret(tmp_path: Path) -> None:
    """Result, debate:events and a SQLite store file, byte for byte, for a debate whose provider
    cannot be reached: its error names the server by URL."""
    db = tmp_path / "checkpoints.db"
    store = store_from_url(f"sqlite:///{db}")
    app = DebateBus("memory://", publish_events=True, heartbeat_interval_s=None)
    llm = failing_provider(secret_url("http://127.0.0.1:9"))  # discard port: refused
    app.subscribe("leaks:request", debate(llm).as_handler(store=store))
    published: list[bytes] = []
    async with app, BusClient("memory://") as client:
        events = await client.transport.subscribe([app.events_topic])
        worker = asyncio.create_task(app.run())
        result = await client.request("leaks:request", {"input": "Should we?"}, timeout=60)
        app.stop()
        await asyncio.wait_for(worker, 60)
        async with asyncio.timeout(5):
            async for delivery in events:
                published.append(delivery.body)
                if b"debate_failed" in delivery.body or b"debate_completed" in delivery.body:
                    break
    assert published
    payload = json.dumps(result.payload)
    assert "cannot reach http://user:***@127.0.0.1:9/v1" in payload
    assert any(b"user:***@127.0.0.1:9" in body for body in published)
    for secret in SECRETS:
        assert secret not in payload
        assert all(secret.encode() not in body for body in published)
        assert secret.encode() not in db.read_bytes()
    # An unreachable provider may pass: the failure is published, not stored as the answer.
    assert result.payload["debateRetryable"] is True
