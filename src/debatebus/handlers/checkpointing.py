"""Encoding of checkpoints and results for a CheckpointStore: one encoder/decoder each, built once."""

from __future__ import annotations

from typing import Any

import msgspec
from pydantic import BaseModel

from debatebus.checkpoints.base import Counters, StoredCheckpoint
from debatebus.engine.definition import DebateSpec
from debatebus.engine.result import Progress
from debatebus.engine.transcript import Round, Turn
from debatebus.schemas.usage import TokenUsage

__all__ = [
    "CheckpointHeader",
    "counters_of",
    "decode_header",
    "decode_result",
    "encode_entry",
    "encode_header",
    "encode_result",
    "restore_progress",
]


class CheckpointHeader(msgspec.Struct, rename="camel", kw_only=True):
    debate_id: str
    debate_name: str
    definition_hash: str
    protocol_version: str
    topic: str
    created_at: str


class FramingEntry(msgspec.Struct, tag="framing"):
    turn: Turn


class RoundEntry(msgspec.Struct, tag="round"):
    round: Round


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    raise NotImplementedError(f"cannot encode {type(obj).__name__} in a checkpoint")


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)
_HEADER_DECODER = msgspec.json.Decoder(CheckpointHeader)
_ENTRY_DECODER = msgspec.json.Decoder(FramingEntry | RoundEntry)
_RESULT_DECODER = msgspec.json.Decoder(dict[str, Any])


def encode_header(header: CheckpointHeader) -> bytes:
    return _ENCODER.encode(header)


def decode_header(data: bytes) -> CheckpointHeader:
    return _HEADER_DECODER.decode(data)


def encode_entry(item: Turn | Round) -> bytes:
    return _ENCODER.encode(FramingEntry(item) if isinstance(item, Turn) else RoundEntry(item))


def encode_result(fields: dict[str, Any]) -> bytes:
    return _ENCODER.encode(fields)


def decode_result(data: bytes) -> dict[str, Any]:
    return _RESULT_DECODER.decode(data)


def counters_of(progress: Progress) -> Counters:
    u = progress.usage
    return Counters(u.prompt_tokens, u.completion_tokens, u.total_tokens, progress.calls)


def restore_progress(stored: StoredCheckpoint, spec: DebateSpec) -> Progress:
    """Committed framing and rounds, with verdicts re-validated by the judge's schema.

    Round numbers only grow, so an entry that repeats a round is skipped: an append retried after
    its reply was lost (by a store's client library, or a custom store) may be stored twice."""
    progress = Progress()
    for raw in stored.entries:
        entry = _ENTRY_DECODER.decode(raw)
        if isinstance(entry, FramingEntry):
            progress.framing = progress.framing or entry.turn
            continue
        rnd = entry.round
        if progress.rounds and rnd.number <= progress.rounds[-1].number:
            continue
        if spec.judge is not None and isinstance(rnd.verdict, dict):
            rnd.verdict = spec.judge.schema.model_validate(rnd.verdict)
        progress.rounds.append(rnd)
    c = stored.counters
    progress.usage = TokenUsage(c.prompt_tokens, c.completion_tokens, c.total_tokens)
    progress.calls = c.calls
    return progress
