"""Logs: JSON lines with request and debate ids on each line, keys redacted, no transcripts."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from tests.observability.observed import DOOMED, FAKE_KEY, TIMEOUT, new_event_type, scripted_llm
from tests.support.bus import make_debate, running, transport_options

from debatebus._worker import DebateBus
from debatebus.client import BusClient
from debatebus.exceptions import ConfigError
from debatebus.handlers import HandlerResult
from debatebus.llm import LLMRequest
from debatebus.observability._logs import (
    LoggingObserver,
    RedactingFilter,
    configure_logging,
    redact,
)
from debatebus.observability._observer import RequestContext
from debatebus.schemas import events as ev
from debatebus.testing import FunctionLLM

TURN_TEXT = "a considered view"
OPENAI_KEY = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx1234"


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    """The root logger writing JSON lines into a buffer, for the test's duration."""
    root = logging.getLogger()
    level = root.level
    stream = io.StringIO()
    handler = configure_logging("json", "DEBUG", stream=stream)
    yield stream
    root.removeHandler(handler)
    root.setLevel(level)


def lines_of(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def leaky_llm() -> FunctionLLM:
    """The scripted debate, plus a careless log line with a key in it on every turn."""
    scripted = scripted_llm()

    async def answer(request: LLMRequest) -> Any:
        logging.getLogger("tests.careless").info("calling the model with api_key=%s", OPENAI_KEY)
        return (await scripted.complete(request)).text

    return FunctionLLM(answer)


@pytest.mark.redis
async def test_json_logs_carry_ids_and_no_keys(redis_server: Any, json_logs: io.StringIO) -> None:
    url, et = redis_server.url, new_event_type()
    app = DebateBus(url, transport_options=transport_options(url), heartbeat_interval_s=None,
                    observers=[LoggingObserver()])
    app.subscribe(et, make_debate(llm=leaky_llm()).as_handler())
    async with running(app), BusClient(url, **transport_options(url)) as client:
        ok = await client.request(et, {"input": "Should we adopt microservices?"},
                                  timeout=TIMEOUT)
        doomed = await client.request(et, {"input": f"{DOOMED} topic", "debateId": "d-doomed"},
                                      timeout=TIMEOUT)
    text = json_logs.getvalue()
    assert FAKE_KEY not in text
    assert OPENAI_KEY not in text
    assert "[REDACTED]" in text
    assert TURN_TEXT not in text
    assert "Should we adopt microservices?" not in text

    lines = lines_of(json_logs)
    for result, debate_id in ((ok, ok.request_id), (doomed, "d-doomed")):
        mine = [line for line in lines if line["requestId"] == result.request_id]
        loggers = {line["logger"] for line in mine}
        assert {"debatebus.requests", "tests.careless"} <= loggers
        assert all(line["debateId"] == debate_id and line["eventType"] == et for line in mine)
        assert all({"ts", "level", "logger", "message"} <= line.keys() for line in mine)
    observed = [line for line in lines if line["logger"] == "debatebus.requests"]
    assert all(line["requestId"] in (ok.request_id, doomed.request_id) for line in observed)
    finished = {line["requestId"]: line for line in observed if "outcome" in line}
    assert finished[ok.request_id]["outcome"] == "completed"
    assert finished[doomed.request_id]["outcome"] == "failed"
    assert finished[doomed.request_id]["level"] == "WARNING"
    failed_turns = [line for line in observed if line["message"].startswith("turn by")]
    assert len(failed_turns) == 2
    assert all("[REDACTED]" in line["message"] for line in failed_turns)


def test_transcripts_only_when_asked(json_logs: io.StringIO) -> None:
    for log_transcripts in (False, True):
        observer = LoggingObserver(log_transcripts=log_transcripts)
        ctx = RequestContext("debate:request", "1-0", 1, request_id=f"r-{log_transcripts}")
        observer.request_started(ctx)
        observer.debate_event(ctx, ev.DebateStarted(
            debate_id="d", seq=1, question="Tabs or spaces?", debate_name="t", protocol="round_robin",
            participants=["a", "b"], max_rounds=2))
        observer.debate_event(ctx, ev.TurnCompleted(
            debate_id="d", seq=2, speaker="a", round=1, text=TURN_TEXT))
        result = HandlerResult("completed", {"debateOutput": "Spaces.", "debateRounds": 1})
        observer.request_finished(ctx, "completed", result, 0.5)
    lines = lines_of(json_logs)
    quiet = [line["message"] for line in lines if line["requestId"] == "r-False"]
    chatty = [line["message"] for line in lines if line["requestId"] == "r-True"]
    assert len(quiet) == len(chatty) == 3
    assert not any(s in m for m in quiet for s in (TURN_TEXT, "Tabs or spaces?", "Spaces."))
    assert all(any(s in m for m in chatty) for s in (TURN_TEXT, "Tabs or spaces?", "Spaces."))


def test_lines_outside_requests_have_null_ids(json_logs: io.StringIO) -> None:
    logging.getLogger("tests.plain").warning("hello %s", "world", extra={"attempt": 2})
    (line,) = [x for x in lines_of(json_logs) if x["logger"] == "tests.plain"]
    assert line["message"] == "hello world"
    assert line["requestId"] is None
    assert line["debateId"] is None
    assert line["attempt"] == 2
    assert line["level"] == "WARNING"
    assert line["ts"].endswith("Z")


def test_tracebacks_are_redacted(json_logs: io.StringIO) -> None:
    try:
        raise RuntimeError(f"Authorization: Bearer {FAKE_KEY[7:]}")
    except RuntimeError:
        logging.getLogger("tests.boom").exception("call failed")
    (line,) = [x for x in lines_of(json_logs) if x["logger"] == "tests.boom"]
    assert "Traceback" in line["exc"]
    assert FAKE_KEY[7:] not in line["exc"]


@pytest.mark.parametrize(("secret", "kept"), [
    (FAKE_KEY, "sk-ant-"),
    (OPENAI_KEY, "sk-"),
    ("Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig", "Bearer "),
    ("api_key=abc123def456", "api_key="),
    ('"x-api-key": "abc123def456"', '"x-api-key": "'),
    # Upper and mixed case, every key name: redact() screens lines for clues before its regexes.
    ("ACCESS-TOKEN: abc123def456", "ACCESS-TOKEN: "),
    ("AuthToken=abc123def456", "AuthToken="),
    ("Password=hunter2", "Password="),
    ("secret = 's3cr3t-value'", "secret = '"),
    ("BEARER abc.def.ghi", "BEARER "),
])
def test_redact(secret: str, kept: str) -> None:
    clean = redact(f"before {secret} after")
    assert clean.startswith(f"before {kept}")
    assert "[REDACTED]" in clean
    assert clean.endswith("after")
    assert secret not in clean


def test_redact_leaves_ordinary_words() -> None:
    text = "use sk-learn for the key idea: a password-free design"
    assert redact(text) == text


def test_redacting_filter_works_on_any_handler() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "key %s", (FAKE_KEY,), None)
    assert RedactingFilter().filter(record)
    assert FAKE_KEY not in record.getMessage()


def test_text_format_and_bad_format() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    handler = configure_logging("text", logging.INFO, stream=stream)
    try:
        logging.getLogger("tests.text").info("with %s", OPENAI_KEY, extra={"requestId": "r-1"})
    finally:
        root.removeHandler(handler)
    line = stream.getvalue().strip()
    assert "INFO tests.text: with sk-[REDACTED]" in line
    assert line.endswith("[requestId=r-1]")
    with pytest.raises(ConfigError):
        configure_logging("xml")
