"""Redis stream entries as debatebus sees them: the fields of a message entry and of a dead letter,
reading an entry back as a ``Delivery``, XREAD replies in any shape, and the settle script that
publishes results and acks one entry exactly once. No I/O here: ``redis_streams`` sends them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from debatebus._redis import Script
from debatebus.transports._base import (
    DELIVERIES_HEADER,
    NO_HEADERS,
    ORIGIN_HEADER,
    ORIGIN_ID_HEADER,
    REASON_HEADER,
    Delivery,
)

ENVELOPE, KEY, HEADERS = b"envelope", b"key", b"headers"
#: Dead-letter fields and the headers they are read back as.
DLQ_FIELDS = {b"reason": REASON_HEADER, b"origin": ORIGIN_HEADER,
               b"originId": ORIGIN_ID_HEADER, b"deliveries": DELIVERIES_HEADER}

# Settle one entry: publish to the streams KEYS[2..] and XACK KEYS[1], only if the entry is still
# pending in the group (any consumer's). Returns 1, or 0 when it was settled already (a retried
# ack whose first reply was lost, or another consumer's ack of an entry both held): then nothing
# is published. Returns -1, publishing nothing, when the entry is not pending because it is gone
# (its group or the entry itself: Redis restarted without its data, or the entry was trimmed
# while it ran): nobody else can answer it, so the caller publishes its answer marked. The
# types are checked before the first write, since Redis does not roll back a
# script that fails half-way. ARGV: group, entry id, the MINID each XADD trims to ('' for none),
# then per output stream: the number of field/value arguments, those arguments.
# Redis Cluster: a script's keys must share one hash slot, so a request stream, its result streams
# and its dead-letter stream must be hash-tagged alike there.
SETTLE = Script("""
local pending = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if type(pending) == 'table' and pending['err'] then
  if string.find(pending['err'], 'NOGROUP', 1, true) then return -1 end
  return pending
end
if #pending == 0 then
  if #redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2]) == 0 then return -1 end
  return 0
end
for i = 2, #KEYS do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= 'stream' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' holds a ' .. kind .. ', not a stream')
  end
end
local at = 4
for i = 2, #KEYS do
  local command = {'XADD', KEYS[i]}
  if ARGV[3] ~= '' then command[3], command[4], command[5] = 'MINID', '~', ARGV[3] end
  command[#command + 1] = '*'
  local count = tonumber(ARGV[at])
  for j = at + 1, at + count do command[#command + 1] = ARGV[j] end
  redis.call(unpack(command))
  at = at + 1 + count
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return 1
""")

_encode_headers = msgspec.json.Encoder().encode
_decode_headers = msgspec.json.Decoder(dict[str, str]).decode
_encode_fields = msgspec.json.Encoder().encode


def entry_to_delivery(topic: str, entry_id: bytes | str, fields: Mapping[bytes, bytes],
                      deliveries: int = 1, token: Any = None) -> Delivery:
    """A stream entry as a ``Delivery``; the common one-field entry costs no extra allocation."""
    ident = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    body = fields.get(ENVELOPE)
    if body is not None and len(fields) == 1:
        return Delivery(topic, body, ident, deliveries, None, NO_HEADERS, token)
    key = fields.get(KEY)
    return Delivery(topic, body_of(fields), ident, deliveries,
                    key.decode(errors="replace") if key is not None else None,
                    headers_of(fields), token,
                    malformed=None if body is not None else _no_envelope(fields))


def field_map(fields: list[bytes]) -> dict[bytes, bytes]:
    """An entry's fields as the batcher reads them (RESP2: ``[name, value, name, value…]``) →
    name → value, as redis-py's commands hand them back."""
    return dict(zip(fields[::2], fields[1::2], strict=True))


def _no_envelope(fields: Mapping[bytes, bytes]) -> str:
    """Why an entry without an ``envelope`` field is not a message: the fields it has instead."""
    names = [name.decode(errors="replace") for name in fields]
    return (f"stream entry has fields {names}, expected {ENVELOPE.decode()!r} holding the JSON "
            'envelope: XADD <stream> * envelope \'{"requestId": "<id>", "payload": {…}}\' '
            "(Synkro's producers PUBLISH instead: serve them on redis+pubsub://)")


def body_of(fields: Mapping[bytes, bytes]) -> bytes:
    body = fields.get(ENVELOPE)
    if body is not None:
        return body
    # Written by a producer that ignores the wire format: hand the worker every field as a JSON
    # object, so its failure event or dead letter still shows what was sent.
    return _encode_fields({k.decode(errors="replace"): v.decode(errors="replace")
                           for k, v in fields.items()})


def headers_of(fields: Mapping[bytes, bytes]) -> Mapping[str, str]:
    raw = fields.get(HEADERS)
    headers: dict[str, str] = {}
    if raw:
        try:
            headers = _decode_headers(raw)
        except msgspec.DecodeError:
            headers = {"x-debatebus-bad-headers": raw.decode(errors="replace")}
    for name, header in DLQ_FIELDS.items():
        value = fields.get(name)
        if value is not None:
            headers[header] = value.decode(errors="replace")
    return headers or NO_HEADERS


def message_fields(body: bytes, key: str | None, headers: Mapping[str, str]) -> list[Any]:
    fields: list[Any] = [ENVELOPE, body]
    if key is not None:
        fields += (KEY, key)
    if headers:
        fields += (HEADERS, _encode_headers(headers if isinstance(headers, dict) else dict(headers)))
    return fields


def stream_entries(reply: Any) -> Iterable[tuple[Any, Any]]:
    """XREAD/XREADGROUP replies as (stream, entries), whatever shape the client was built for:
    a list of pairs (RESP2, and redis-py 8's default of RESP3 with legacy shapes), a dict
    (``legacy_responses=False``), or a dict of one-element lists (``protocol=3`` given)."""
    if not reply:
        return ()
    if not isinstance(reply, dict):
        return reply  # type: ignore[no-any-return]
    return ((name, entries[0] if entries and isinstance(entries[0], list) else entries)
            for name, entries in reply.items())
