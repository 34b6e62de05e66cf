"""``debatebus worker … --metrics-port --log-format json`` in a real process, with ``check``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.observability.observed import debatebus_check
from tests.support.processes import start_worker
from tests.support.servers import free_port

from debatebus._worker import DebateBus
from debatebus.cli import build_parser
from debatebus.cli._bus_cmds import _observe
from debatebus.client import BusClient
from debatebus.observability._heartbeat import latest_heartbeat
from debatebus.observability._logs import LoggingObserver
from debatebus.observability._tracing import TracingObserver

WAIT = 60.0


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


async def metric_line(port: int, prefix: str) -> str:
    """The exposition line starting with ``prefix``, once it is there: the worker counts a request
    just after publishing its result, so the client can be a moment ahead of the counter."""
    async with asyncio.timeout(WAIT):
        while True:
            text = await asyncio.to_thread(scrape, port)
            found = [line for line in text.splitlines() if line.startswith(prefix)]
            if found:
                return found[0]
            await asyncio.sleep(0.1)


@pytest.mark.redis
@pytest.mark.slow
async def test_worker_serves_metrics_json_logs_and_heartbeats(redis_server: Any,
                                                              tmp_path: Path) -> None:
    url, port = redis_server.url, free_port()
    et, group = f"debate:request{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "worker.log"
    proc = start_worker(url, et, group, port, log)
    try:
        async with asyncio.timeout(WAIT):
            while await latest_heartbeat(url, group) is None:
                assert proc.poll() is None, log.read_text()
                await asyncio.sleep(0.1)
        assert (await debatebus_check("--broker", url, "--group", group, "--max-age", "300"))[0] == 0
        async with BusClient(url) as client:
            result = await client.request(et, {"input": "Tabs or spaces?"}, timeout=WAIT)
        assert result.payload["debateStatus"] == "completed"
        line = await metric_line(port, f'debatebus_debates_completed_total{{event_type="{et}"}}')
        assert line.endswith(" 1.0")
        text = await asyncio.to_thread(scrape, port)
        assert 'debatebus_llm_calls_total{' in text
        assert "debatebus_debate_duration_seconds_bucket" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode == 0, log.read_text()
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    mine = [line for line in lines if line.get("requestId") == result.request_id]
    assert any(line.get("outcome") == "completed" for line in mine)
    assert all(line["debateId"] == result.request_id for line in mine)


def test_worker_options_attach_observers(caplog: pytest.LogCaptureFixture) -> None:
    args = build_parser().parse_args(
        ["worker", "tests.observability.cli_app:app", "--otel", "--log-transcripts",
         "--log-format", "json", "--log-level", "debug"])
    assert (args.log_format, args.log_level) == ("json", "DEBUG")
    app = DebateBus("memory://")
    with caplog.at_level(logging.WARNING):
        _observe(app, args)
    logging_observer, tracing = app.observers
    assert isinstance(logging_observer, LoggingObserver)
    assert logging_observer.log_transcripts
    assert isinstance(tracing, TracingObserver)
    assert tracing.enabled
    assert app.observer is not None
    assert "no OpenTelemetry SDK" in caplog.text  # this process set no tracer provider


def test_a_worker_is_named_by_the_flag_the_app_or_the_environment(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["worker", "tests.observability.cli_app:app",
                                      "--consumer", "worker-1"])
    assert args.consumer == "worker-1"
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["worker", "tests.observability.cli_app:app", "--consumer", " "])
    assert exited.value.code == 2
    assert "must name the consumer" in capsys.readouterr().err
    monkeypatch.setenv("DEBATEBUS_CONSUMER", "from-env")
    assert DebateBus("memory://").consumer == "from-env"
    assert DebateBus("memory://", consumer="from-app").consumer == "from-app"
    monkeypatch.delenv("DEBATEBUS_CONSUMER")
    first, second = DebateBus("memory://").consumer, DebateBus("memory://").consumer
    assert first != second  # unnamed workers never share a name
    assert first.startswith(f"{socket.gethostname()}-{os.getpid()}-")
