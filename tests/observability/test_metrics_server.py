"""``start_metrics_server``: loopback unless told otherwise, ``/metrics`` only, to the allowed
Hosts, with the token when one is set; and a warning when it binds beyond loopback without one."""

from __future__ import annotations

import contextlib
import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from debatebus.exceptions import ConfigError
from debatebus.observability._metrics import (
    MetricsServer,
    PrometheusObserver,
    start_metrics_server,
)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("probe", "A counter the scrape must show.", registry=registry).inc(3)
    return registry


@pytest.fixture
def server(registry: CollectorRegistry) -> Iterator[MetricsServer]:
    server, thread = start_metrics_server(0, registry)
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_binds_loopback_by_default(server: MetricsServer) -> None:
    host, port = server.server_address[:2]
    assert host == "127.0.0.1"
    status, body = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    assert "probe_total 3.0" in body


@pytest.mark.parametrize("path", ["/", "/favicon.ico", "/metrics/extra", "/other?x=1"])
def test_serves_only_metrics(server: MetricsServer, path: str) -> None:
    port = server.server_address[1]
    status, body = get(f"http://127.0.0.1:{port}{path}")
    assert status == 404
    assert "probe_total" not in body


def test_metrics_path_with_a_query_still_serves(server: MetricsServer) -> None:
    status, body = get(f"http://127.0.0.1:{server.server_address[1]}/metrics?name[]=probe_total")
    assert status == 200
    assert "probe_total" in body


def test_takes_another_host(registry: CollectorRegistry) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        server, thread = start_metrics_server(0, registry, host="::1")
    except OSError as exc:
        pytest.skip(f"cannot bind ::1: {exc}")
    try:
        assert server.server_address[0] == "::1"
        status, body = get(f"http://[::1]:{server.server_address[1]}/metrics")
        assert status == 200 and "probe_total" in body
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_worker_cli_passes_metrics_host() -> None:
    from debatebus.cli import build_parser

    args = build_parser().parse_args(["worker", "m:app", "--metrics-port", "9108",
                                      "--metrics-host", "0.0.0.0"])
    assert (args.metrics_port, args.metrics_host) == (9108, "0.0.0.0")
    assert build_parser().parse_args(["worker", "m:app"]).metrics_host is None


# ---- who may scrape: the token, the Host, the warning --------------------------------------------

TOKEN = "metrics-token-0123456789"


@contextlib.contextmanager
def serving(registry: CollectorRegistry, **options: Any) -> Iterator[httpx.Client]:
    """A metrics server on a free port and an httpx client that asks it on 127.0.0.1."""
    server, thread = start_metrics_server(0, registry, **options)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_address[1]}",
                          timeout=10) as http:
            yield http
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def warnings_from(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "debatebus.metrics" and r.levelno >= logging.WARNING]


def test_with_a_token_a_scrape_needs_it(registry: CollectorRegistry) -> None:
    with serving(registry, token=TOKEN) as http:
        for refused in (http.get("/metrics"), http.get("/metrics", params={"token": "nope"}),
                        http.get("/metrics", headers={"Authorization": "Bearer nope"}),
                        http.get("/", headers={"Authorization": "Bearer nope"})):
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"].startswith("Bearer")
            assert "probe_total" not in refused.text
        for served in (http.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}),
                       http.get("/metrics", params={"token": TOKEN})):
            assert served.status_code == 200
            assert "probe_total 3.0" in served.text
        assert http.get("/other", params={"token": TOKEN}).status_code == 404


def test_a_scrape_sent_to_another_host_is_refused(registry: CollectorRegistry) -> None:
    with serving(registry, token=TOKEN, allowed_hosts=["worker-1.metrics.example"]) as http:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        for host in ("evil.example", "worker-1.metrics.example.evil.example", "0.0.0.0"):
            refused = http.get("/metrics", headers={**bearer, "Host": host})
            assert refused.status_code == 421, host
            assert "probe_total" not in refused.text
            assert "--metrics-allowed-host" in refused.text
        for host in ("localhost", "[::1]:9108", "worker-1.metrics.example:9108"):
            assert http.get("/metrics", headers={**bearer, "Host": host}).status_code == 200, host


def test_bound_to_every_interface_without_a_token_it_warns(registry: CollectorRegistry,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "debatebus.metrics"), \
            serving(registry, host="0.0.0.0") as http:
        (warning,) = warnings_from(caplog)
        port = int(http.base_url.port or 0)
        # Bound to every interface, scrapers reach it by any name or address: only a token (or
        # --metrics-allowed-host) restricts it there.
        assert http.get("/metrics").status_code == 200
        assert http.get("/metrics", headers={"Host": f"0.0.0.0:{port}"}).status_code == 200
        assert http.get("/metrics", headers={"Host": "10.1.2.3:9108"}).status_code == 200
    assert f"the metrics server listens on 0.0.0.0 port {port}, beyond loopback, " \
           "with NO TOKEN" in warning
    assert "this worker's metrics (event types, model and participant names" in warning
    assert "--metrics-token or $DEBATEBUS_METRICS_TOKEN" in warning


def test_with_a_token_or_on_loopback_there_is_no_warning(registry: CollectorRegistry,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "debatebus.metrics"):
        with serving(registry, host="0.0.0.0", token=TOKEN) as http:
            assert http.get("/metrics").status_code == 401
        with serving(registry, host="localhost") as http:
            assert http.get("/metrics").status_code == 200
        assert warnings_from(caplog) == []
        with serving(registry, host="0.0.0.0"):
            assert len(warnings_from(caplog)) == 1  # the same check does fire without a token


def test_worker_cli_takes_a_metrics_token_and_allowed_hosts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from debatebus._worker import DebateBus
    from debatebus.cli import build_parser
    from debatebus.cli._bus_cmds import _observe

    parser = build_parser()
    args = parser.parse_args(["worker", "m:app", "--metrics-port", "9108", "--metrics-token", TOKEN,
                              "--metrics-allowed-host", "a.example", "--metrics-allowed-host", "b"])
    assert (args.metrics_token, args.metrics_allowed_host) == (TOKEN, ["a.example", "b"])
    for option in (["--metrics-token", TOKEN], ["--metrics-allowed-host", "a.example"]):
        alone = parser.parse_args(["worker", "m:app", *option])
        with pytest.raises(ConfigError, match=f"{option[0]} needs --metrics-port"):
            _observe(DebateBus("memory://"), alone)
    # The token from the environment reaches the server, which checks it before it binds.
    monkeypatch.setenv("DEBATEBUS_METRICS_TOKEN", "too-short")
    app = DebateBus("memory://")
    with pytest.raises(ConfigError, match="a token must be at least 16") as info:
        _observe(app, parser.parse_args(["worker", "m:app", "--metrics-port", "9108"]))
    assert "too-short" not in str(info.value)
    assert not any(isinstance(o, PrometheusObserver) for o in app.observers)
