"""Encoding of checkpoints and results for a CheckpointStore: one encoder/decoder each, built once.

Both the checkpoint header and the stored result record the fingerprint of what was asked (the
input, ``maxRounds`` and the preset, if any), so a debate id reused for another question is
refused, never answered with the other question's debate. (A record without one, written
before fingerprints existed, was kept under a key this version never reads: ``debate_key``.)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec
from pydantic import BaseModel

from debatebus.checkpoints.base import Counters, StoredCheckpoint
from debatebus.engine.definition import DebateSpec
from debatebus.engine.result import Progress
from debatebus.engine.subdebates import SubDebateRecord
from debatebus.engine.transcript import Round, Turn
from debatebus.exceptions import InputError
from debatebus.schemas.usage import ZERO_USAGE, TokenUsage

__all__ = [
    "Ask",
    "CheckpointHeader",
    "StoredResult",
    "committed_items",
    "counters_of",
    "debate_key",
    "decode_header",
    "decode_result",
    "encode_entry",
    "encode_header",
    "encode_result",
    "request_fingerprint",
    "restore_progress",
    "reused_id",
    "spent_by_speaker",
]

# A key no result field uses: the fingerprint rides in the stored result's JSON object.
_FINGERPRINT_KEY = "debatebusFingerprint"


def request_fingerprint(question: str, max_rounds: int | None, preset: str | None = None,
                        depth: int = 0) -> str:
    """What a request asks, hashed: everything a producer can set that changes the debate. The
    preset counts only when named, and the sub-debate depth only above 0, so requests without
    them keep their earlier fingerprints."""
    asked: dict[str, Any] = {"v": 1, "input": question, "maxRounds": max_rounds}
    if preset is not None:
        asked["preset"] = preset
    if depth:
        asked["depth"] = depth
    return hashlib.sha256(_ENCODER.encode(asked)).hexdigest()[:32]


def debate_key(namespace: str, debate_id: str) -> str:
    """Where a debate's checkpoint, result and lease are kept in a store: its debate id within
    ``namespace``, the event type it was asked on (on a bus) or the debate's name (called
    directly). So each hop of a chain owns its debate although requestIds (and echoed debateIds)
    travel along the chain, and a replay of an event type finds that event type's debates."""
    return f"{namespace}/{debate_id}"


@dataclass(frozen=True, slots=True)
class Ask:
    """One request's question: its input, round cap, debate id, which field named the id, the
    preset it asked for (None: the handler's own debate), its sub-debate depth (0: a top-level
    debate), and its ``namespace``: the event type it was asked on, or the debate's name when
    called directly (see ``debate_key``)."""

    question: str
    max_rounds: int | None
    debate_id: str
    id_field: str  # "requestId" or "debateId"
    request_id: str | None
    fingerprint: str
    namespace: str
    preset: str | None = None
    depth: int = 0

    @classmethod
    def of(cls, question: str, max_rounds: int | None, debate_id: str, id_field: str,
           request_id: str | None, namespace: str, preset: str | None = None,
           depth: int = 0) -> Ask:
        return cls(question, max_rounds, debate_id, id_field, request_id,
                   request_fingerprint(question, max_rounds, preset, depth), namespace, preset,
                   depth)

    @property
    def key(self) -> str:
        """Where its debate is kept in a store."""
        return debate_key(self.namespace, self.debate_id)

    def matches(self, fingerprint: str | None) -> bool:
        """Whether a stored record (its fingerprint) answers this question."""
        return fingerprint == self.fingerprint


def reused_id(ask: Ask) -> InputError:
    return InputError(
        f"{ask.id_field} {ask.debate_id!r} was already used for a debate with a different input "
        "(payload.input, maxRounds or preset differ), so its result is not this request's answer: send a "
        f"new requestId{' without debateId' if ask.id_field == 'debateId' else ''} for a new "
        'debate, or "replay": "rerun" to run this input afresh. A chain may keep its requestId '
        f"from hop to hop: each event type keeps its own debates (this one is on {ask.namespace!r})"
    )


class CheckpointHeader(msgspec.Struct, rename="camel", kw_only=True):
    debate_id: str
    debate_name: str
    definition_hash: str
    protocol_version: str
    question: str = msgspec.field(name="topic")  # its stored name, from before the rename
    created_at: str
    fingerprint: str | None = None  # None in headers written before fingerprints


class FramingEntry(msgspec.Struct, tag="framing"):
    turn: Turn


class RoundEntry(msgspec.Struct, tag="round"):
    round: Round


class ChildEntry(msgspec.Struct, tag="child"):
    """A sub-debate's record: committed when it starts (before its request is published) and
    again, final, with the round that used its outcome; the last one of a child id wins."""

    child: SubDebateRecord


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    raise NotImplementedError(f"cannot encode {type(obj).__name__} in a checkpoint")


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)
_HEADER_DECODER = msgspec.json.Decoder(CheckpointHeader)
_ENTRY_DECODER = msgspec.json.Decoder(FramingEntry | RoundEntry | ChildEntry)
_RESULT_DECODER = msgspec.json.Decoder(dict[str, Any])


def encode_header(header: CheckpointHeader) -> bytes:
    return _ENCODER.encode(header)


def decode_header(data: bytes) -> CheckpointHeader:
    return _HEADER_DECODER.decode(data)


def encode_entry(item: Turn | Round | SubDebateRecord) -> bytes:
    if isinstance(item, SubDebateRecord):
        return _ENCODER.encode(ChildEntry(item))
    return _ENCODER.encode(FramingEntry(item) if isinstance(item, Turn) else RoundEntry(item))


class StoredResult(NamedTuple):
    fields: dict[str, Any]
    fingerprint: str | None  # None in results stored before fingerprints


def encode_result(fields: dict[str, Any], fingerprint: str) -> bytes:
    return _ENCODER.encode({**fields, _FINGERPRINT_KEY: fingerprint})


def decode_result(data: bytes) -> StoredResult:
    fields = _RESULT_DECODER.decode(data)
    fingerprint = fields.pop(_FINGERPRINT_KEY, None)
    return StoredResult(fields, fingerprint if isinstance(fingerprint, str) else None)


def committed_items(progress: Progress) -> list[Turn | Round | SubDebateRecord]:
    """Everything ``progress`` holds, as checkpoint entries: the framing, the rounds, the
    children's records (``restore_progress`` reads them back in any order)."""
    framing: list[Turn | Round | SubDebateRecord] = [] if progress.framing is None else [
        progress.framing]
    return [*framing, *progress.sub_debates, *progress.rounds]


def counters_of(progress: Progress) -> Counters:
    u = progress.usage
    return Counters(u.prompt_tokens, u.completion_tokens, u.total_tokens, progress.calls)


def restore_progress(stored: StoredCheckpoint, spec: DebateSpec) -> Progress:
    """Committed framing, rounds and sub-debate records, with verdicts re-validated by the
    judge's schema.

    Round numbers only grow, so an entry that repeats a round is skipped: an append retried after
    its reply was lost (by a store's client library, or a custom store) may be stored twice."""
    progress = Progress()
    children: dict[str, SubDebateRecord] = {}  # in start order; a later record replaces
    for raw in stored.entries:
        entry = _ENTRY_DECODER.decode(raw)
        if isinstance(entry, FramingEntry):
            progress.framing = progress.framing or entry.turn
            continue
        if isinstance(entry, ChildEntry):
            children[entry.child.child_id] = entry.child
            continue
        rnd = entry.round
        if progress.rounds and rnd.number <= progress.rounds[-1].number:
            continue
        if spec.judge is not None and isinstance(rnd.verdict, dict):
            rnd.verdict = spec.judge.schema.model_validate(rnd.verdict)
        progress.rounds.append(rnd)
    progress.sub_debates = list(children.values())
    progress.by_speaker = spent_by_speaker(progress, spec)
    cached = sum(progress.by_speaker.values(), ZERO_USAGE)
    c = stored.counters
    progress.usage = TokenUsage(c.prompt_tokens, c.completion_tokens, c.total_tokens,
                                cached.cache_read_tokens, cached.cache_write_tokens)
    progress.calls = c.calls
    return progress


def spent_by_speaker(progress: Progress, spec: DebateSpec) -> dict[str, TokenUsage]:
    """Who spent what in the committed framing and rounds: each turn's usage is its speaker's,
    and what a round spent beyond its turns is its judge's. (The counters stored at each commit
    are the same calls' total: the per-speaker split is read back from the entries.)"""
    spent: dict[str, TokenUsage] = {}

    def add(who: str, usage: TokenUsage) -> None:
        spent[who] = spent.get(who, ZERO_USAGE) + usage

    if progress.framing is not None:
        add(progress.framing.speaker, progress.framing.usage)
    for rnd in progress.rounds:
        for turn in rnd.turns:
            add(turn.speaker, turn.usage)
        beyond = rnd.usage - sum((t.usage for t in rnd.turns), ZERO_USAGE)
        if spec.judge is not None and beyond != ZERO_USAGE:
            add(spec.judge.name, beyond)
    return spent
