"""Watching a worker from the outside: the ``Observer`` hooks (``observer``), Prometheus metrics,
OpenTelemetry traces, structured logs and heartbeats.

Each piece but the hooks is an optional extra, so its names are imported on first use: ``import
debatebus.observability`` works without prometheus-client or OpenTelemetry installed, and only the
piece you touch needs its dependency.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from debatebus.observability._observer import Observer, RequestContext, Settlement

if TYPE_CHECKING:
    from debatebus._redaction import redact
    from debatebus.observability._heartbeat import beat_forever, latest_heartbeat
    from debatebus.observability._logs import LoggingObserver, configure_logging
    from debatebus.observability._metrics import PrometheusObserver, start_metrics_server
    from debatebus.observability._tracing import TracingObserver, inject_traceparent
    from debatebus.transports._base import HEARTBEAT_TOPIC

__all__ = [
    "HEARTBEAT_TOPIC",
    "LoggingObserver",
    "Observer",
    "PrometheusObserver",
    "RequestContext",
    "Settlement",
    "TracingObserver",
    "beat_forever",
    "configure_logging",
    "inject_traceparent",
    "latest_heartbeat",
    "redact",
    "start_metrics_server",
]

_HOMES = {
    "HEARTBEAT_TOPIC": "_heartbeat",
    "beat_forever": "_heartbeat",
    "latest_heartbeat": "_heartbeat",
    "LoggingObserver": "_logs",
    "configure_logging": "_logs",
    "redact": "_logs",
    "PrometheusObserver": "_metrics",
    "start_metrics_server": "_metrics",
    "TracingObserver": "_tracing",
    "inject_traceparent": "_tracing",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
