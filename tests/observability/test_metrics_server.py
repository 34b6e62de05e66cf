"""``start_metrics_server``: loopback unless told otherwise, and ``/metrics`` only."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from debatebus.observability.metrics import MetricsServer, start_metrics_server


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
