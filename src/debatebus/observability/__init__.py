"""Watching a worker from the outside: the ``Observer`` hooks (``observer``), Prometheus metrics,
OpenTelemetry traces, structured logs and heartbeats.

Each piece but the hooks is an optional extra, so its names are imported on first use: ``import
debatebus.observability`` works without prometheus-client or OpenTelemetry installed, and only the
piece you touch needs its dependency.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from debatebus.observability.observer import Observer, RequestContext, Settlement

if TYPE_CHECKING:
    from debatebus.observability.heartbeat import (
        HEARTBEAT_TOPIC,
        beat_forever,
        latest_heartbeat,
    )
    from debatebus.observability.logs import LoggingObserver, configure_logging, redact
    from debatebus.observability.metrics import PrometheusObserver, start_metrics_server
    from debatebus.observability.tracing import TracingObserver, inject_traceparent

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
    "HEARTBEAT_TOPIC": "heartbeat",
    "beat_forever": "heartbeat",
    "latest_heartbeat": "heartbeat",
    "LoggingObserver": "logs",
    "configure_logging": "logs",
    "redact": "logs",
    "PrometheusObserver": "metrics",
    "start_metrics_server": "metrics",
    "TracingObserver": "tracing",
    "inject_traceparent": "tracing",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
