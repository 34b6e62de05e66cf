"""The envelope every message on the bus travels in, compatible with Synkro's ``{requestId, payload}``.

Versioning rules: a new field always gets a default; a field's type never changes; readers ignore
fields they don't know (msgspec does by default), so old workers read new producers' messages.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

__all__ = [
    "ENVELOPE_DECODER",
    "ENVELOPE_ENCODER",
    "SCHEMA_VERSION",
    "Envelope",
    "completed_topic",
    "failed_topic",
    "lenient_request",
    "now_iso",
]

SCHEMA_VERSION = 1


class Envelope(msgspec.Struct, rename="camel", omit_defaults=True, gc=False):
    """``{"requestId": "...", "payload": {...}}`` plus optional tracing and routing fields."""

    request_id: str
    payload: dict[str, Any]
    type: str | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    timestamp: str | None = None
    schema_version: int = SCHEMA_VERSION
    headers: dict[str, str] = {}


ENVELOPE_DECODER = msgspec.json.Decoder(Envelope)
ENVELOPE_ENCODER = msgspec.json.Encoder()


def completed_topic(event_type: str) -> str:
    return f"event:{event_type}:completed"


def failed_topic(event_type: str) -> str:
    return f"event:{event_type}:failed"


_last_second: tuple[int, str] = (-1, "")


def now_iso() -> str:
    """UTC timestamp with millisecond precision, ISO 8601 (``2026-11-30T07:00:00.123Z``)."""
    global _last_second
    now = time.time()
    second = int(now)
    # Every result carries one: formatting the date once per second, not per message, halves it.
    if second != _last_second[0]:
        _last_second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{_last_second[1]}.{int((now - second) * 1000):03d}Z"


def lenient_request(body: bytes) -> tuple[str | None, dict[str, Any]]:
    """Best effort: the requestId and payload of a body that may not be a valid envelope (a
    malformed request's failure event, ops replay)."""
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None, {}
    if not isinstance(data, dict):
        return None, {}
    rid = data.get("requestId")
    payload = data.get("payload")
    return (rid if isinstance(rid, str) and rid else None), (payload if isinstance(payload, dict) else {})
