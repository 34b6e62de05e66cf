"""The envelope every message on the bus travels in, compatible with Synkro's ``{requestId, payload}``.

Versioning rules: a new field always gets a default; a field's type never changes; readers ignore
fields they don't know (msgspec does by default), so old workers read new producers' messages.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from typing import Any

import msgspec

from debatebus.exceptions import InputError

__all__ = [
    "ENVELOPE_DECODER",
    "ENVELOPE_ENCODER",
    "SCHEMA_VERSION",
    "Envelope",
    "answer_message_id",
    "completed_topic",
    "decode_request",
    "failed_topic",
    "is_result_topic",
    "lenient_request",
    "new_message_id",
    "now_iso",
]

SCHEMA_VERSION = 1


class Envelope(msgspec.Struct, rename="camel", omit_defaults=True, gc=False):
    """``{"requestId": "...", "payload": {...}}`` plus optional tracing and routing fields.

    ``messageId`` is this message's own id (a request and its result share the ``requestId``, never
    the ``messageId``); ``causationId`` is the ``messageId`` of the message this one answers (its
    ``requestId`` when that message has none: a producer older than the field);
    ``correlationId`` is carried forward unchanged along a chain. ``headers`` carry the W3C trace
    context (``traceparent``/``tracestate``) and whatever else a producer adds."""

    request_id: str
    payload: dict[str, Any]
    message_id: str | None = None
    type: str | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    timestamp: str | None = None
    schema_version: int = SCHEMA_VERSION
    headers: dict[str, str] = {}


# float_hook: a number too large for a float (``1e400``) decodes to inf, so the payload validator
# can say what to send instead of the whole envelope being unreadable.
ENVELOPE_DECODER = msgspec.json.Decoder(Envelope, float_hook=float)
_LENIENT_DECODER = msgspec.json.Decoder(float_hook=float)
ENVELOPE_ENCODER = msgspec.json.Encoder()


def completed_topic(event_type: str) -> str:
    return f"event:{event_type}:completed"


def failed_topic(event_type: str) -> str:
    return f"event:{event_type}:failed"


def is_result_topic(topic: str) -> bool:
    """Whether ``topic`` carries results (``event:<type>:completed`` or ``…:failed``): a handler
    subscribed to one is a hop of a chain, and its payloads are another debate's results."""
    return topic.startswith("event:") and topic.endswith((":completed", ":failed"))


def answer_message_id(request_message_id: str, topic: str) -> str:
    """The ``messageId`` of the message on ``topic`` answering the request message
    ``request_message_id``: the same every time it is sent again (a retried settle, a redelivery
    after a lost acknowledgement, a replay), so a consumer drops the copies by ``messageId``.
    Formatted like ``new_message_id``'s (32 hex digits); a hash, not a random UUID."""
    return hashlib.blake2b(f"{request_message_id}\x00{topic}".encode(), digest_size=16).hexdigest()


def new_message_id() -> str:
    """A fresh, unique ``messageId``: a random (version 4) UUID in hex, as ``uuid4().hex`` writes
    it, made from its 16 random bytes directly (every result takes one; a quarter of the cost)."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    return raw.hex()


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


def decode_request(body: bytes) -> Envelope:
    """The request envelope in ``body``, or ``InputError`` saying what the producer must fix.
    Every way a body can be unreadable is bad input, nesting too deep to decode included."""
    try:
        request = ENVELOPE_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise InputError(f"envelope does not match the schema ({exc}): send "
                         '{"requestId": "<id>", "payload": {"input": "<topic>"}}') from None
    except msgspec.DecodeError as exc:
        raise InputError(f"body is not valid JSON ({exc}): send a UTF-8 JSON envelope") from None
    except RecursionError:
        raise InputError("body nests too deeply to decode: send an envelope whose payload nests "
                         "less than a few hundred levels") from None
    if not request.request_id:
        raise InputError('requestId is empty: send a non-empty requestId, e.g. a UUID')
    return request


def lenient_request(body: bytes) -> tuple[str | None, dict[str, Any]]:
    """Best effort: the requestId and payload of a body that may not be a valid envelope (a
    malformed request's failure event, ops replay). Never recurses deeper than the decoder may:
    a body nested too deeply to decode yields its top-level requestId and no payload."""
    try:
        data = _LENIENT_DECODER.decode(body)
    except msgspec.DecodeError:
        return None, {}
    except RecursionError:
        return _shallow_request_id(body), {}
    if not isinstance(data, dict):
        return None, {}
    rid = data.get("requestId")
    payload = data.get("payload")
    return (rid if isinstance(rid, str) and rid else None), (payload if isinstance(payload, dict) else {})


# A JSON string (escapes included) or one structural character: enough to follow nesting without
# recursion, since the characters of a string never count.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]')
_REQUEST_ID_KEY = b'"requestId"'


def _shallow_request_id(body: bytes) -> str | None:
    """The string value of the top-level ``requestId`` key, found by scanning tokens with a depth
    counter (no recursion, linear time); None when there is no such non-empty string."""
    depth, expect, key = 0, "", b""
    for match in _TOKEN.finditer(body):
        token = match.group()
        if token in (b"{", b"["):
            if depth == 0 and token != b"{":
                return None
            depth += 1
            expect = "key" if depth == 1 else expect
        elif token in (b"}", b"]"):
            depth -= 1
        elif depth != 1:
            continue
        elif token == b",":
            expect = "key"
        elif token == b":":
            expect = "value" if expect == "colon" else ""
        elif expect == "key":
            expect, key = "colon", token
        elif expect == "value" and key == _REQUEST_ID_KEY:
            try:
                rid = msgspec.json.decode(token)
            except msgspec.DecodeError:
                return None
            return rid if isinstance(rid, str) and rid else None
        else:
            expect = ""
    return None
