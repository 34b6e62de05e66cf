"""Encoding of checkpoints and results for a CheckpointStore: one encoder/decoder each, built once.

Both the checkpoint header and the stored result record the fingerprint of what was asked (the
input, ``maxRounds`` and the preset, if any), so a debate id reused for another question is
refused, never answered with the other question's debate. (A record without one, written
before fingerprints existed, was kept under a key this version never reads: ``debate_key``.)
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import msgspec
from pydantic import BaseModel, ValidationError

from debatebus._usage import ZERO_USAGE, TokenUsage
from debatebus.checkpoints._base import Counters, StoredCheckpoint
from debatebus.engine._definition import DebateSpec
from debatebus.engine._people import HumanTurnRecord, PlayedTurn
from debatebus.engine._result import Progress
from debatebus.engine._subdebates import SubDebateRecord
from debatebus.engine._transcript import Round, Turn

# Keys no result field uses: the fingerprint, and what a fork needs of a finished debate, ride in
# the stored result's JSON object.
_FINGERPRINT_KEY = "debatebusFingerprint"
_BASIS_KEY = "debatebusForkBasis"


def debate_key(namespace: str, debate_id: str) -> str:
    """Where a debate's checkpoint, result and lease are kept in a store: its debate id within
    ``namespace``, the event type it was asked on (on a bus) or the debate's name (called
    directly). So each hop of a chain owns its debate although requestIds (and echoed debateIds)
    travel along the chain, and a replay of an event type finds that event type's debates."""
    return f"{namespace}/{debate_id}"


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


class TurnEntry(msgspec.Struct, tag="turn"):
    """A turn of a round not yet committed (debates with people), committed as it ended."""

    turn: Turn


class PersonEntry(msgspec.Struct, tag="person"):
    """A person's turn asked for: committed before its request is published."""

    person: HumanTurnRecord


#: What a checkpoint's entries hold, as the engine commits them.
Item = Turn | Round | SubDebateRecord | PlayedTurn | HumanTurnRecord


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    raise NotImplementedError(f"cannot encode {type(obj).__name__} in a checkpoint")


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)
_HEADER_DECODER = msgspec.json.Decoder(CheckpointHeader)
_ENTRY_DECODER = msgspec.json.Decoder(
    FramingEntry | RoundEntry | ChildEntry | TurnEntry | PersonEntry)
_RESULT_DECODER = msgspec.json.Decoder(dict[str, Any])


def encode_header(header: CheckpointHeader) -> bytes:
    return _ENCODER.encode(header)


def decode_header(data: bytes) -> CheckpointHeader:
    return _HEADER_DECODER.decode(data)


def encode_entry(item: Item) -> bytes:
    """One checkpoint entry, tagged by what it holds (the wire's edge: one dispatch here)."""
    entry: FramingEntry | RoundEntry | ChildEntry | TurnEntry | PersonEntry
    if isinstance(item, SubDebateRecord):
        entry = ChildEntry(item)
    elif isinstance(item, PlayedTurn):
        entry = TurnEntry(item.turn)
    elif isinstance(item, HumanTurnRecord):
        entry = PersonEntry(item)
    else:
        entry = FramingEntry(item) if isinstance(item, Turn) else RoundEntry(item)
    return _ENCODER.encode(entry)


class ForkBasis(msgspec.Struct, kw_only=True):
    """What a fork of a finished debate needs besides its result's transcript: the question and
    the framing (stored with the result, not published)."""

    question: str
    framing: Turn | None = None


class StoredResult(NamedTuple):
    fields: dict[str, Any]
    fingerprint: str | None  # None in results stored before fingerprints
    basis: ForkBasis | None = None  # None in results stored before forks


def encode_result(fields: dict[str, Any], fingerprint: str,
                  basis: ForkBasis | None = None) -> bytes:
    extra = {} if basis is None else {_BASIS_KEY: basis}
    return _ENCODER.encode({**fields, _FINGERPRINT_KEY: fingerprint, **extra})


def decode_result(data: bytes) -> StoredResult:
    fields = _RESULT_DECODER.decode(data)
    fingerprint = fields.pop(_FINGERPRINT_KEY, None)
    basis: ForkBasis | None = None
    with contextlib.suppress(msgspec.ValidationError):
        basis = msgspec.convert(fields.pop(_BASIS_KEY, None), ForkBasis | None)
    return StoredResult(fields, fingerprint if isinstance(fingerprint, str) else None, basis)


def committed_items(progress: Progress) -> list[Item]:
    """Everything ``progress`` holds, as checkpoint entries: the framing, the rounds, the
    children's and persons' records, the turns of rounds not yet committed
    (``restore_progress`` reads them back in any order)."""
    framing: list[Item] = [] if progress.framing is None else [progress.framing]
    return [*framing, *progress.sub_debates, *progress.people, *progress.rounds,
            *(PlayedTurn(turn=t) for t in progress.turns)]


def counters_of(progress: Progress) -> Counters:
    u = progress.usage
    return Counters(u.prompt_tokens, u.completion_tokens, u.total_tokens, progress.calls)


def judged(rnd: Round, spec: DebateSpec, *, lenient: bool = False) -> Round:
    """``rnd`` with its stored verdict (JSON) validated by ``spec``'s judge schema again.
    ``lenient`` (a fork with another judge): a verdict that schema refuses is kept as JSON."""
    if spec.judge is not None and isinstance(rnd.verdict, dict):
        try:
            rnd.verdict = spec.judge.schema.model_validate(rnd.verdict)
        except ValidationError:
            if not lenient:
                raise
    return rnd


def _restore_round(progress: Progress, rnd: Round, spec: DebateSpec, lenient: bool) -> None:
    if progress.rounds and rnd.number <= progress.rounds[-1].number:
        return
    progress.rounds.append(judged(rnd, spec, lenient=lenient))


def restore_progress(stored: StoredCheckpoint, spec: DebateSpec, *,
                     lenient: bool = False) -> Progress:
    """Committed framing, rounds, sub-debate and person records, and the turns of the round in
    progress committed alone (debates with people), with verdicts re-validated by the judge's
    schema (``lenient``: see ``judged``).

    Round numbers only grow, so an entry that repeats a round is skipped: an append retried after
    its reply was lost (by a store's client library, or a custom store) may be stored twice."""
    progress = Progress()
    children: dict[str, SubDebateRecord] = {}  # in start order; a later record replaces
    people: dict[str, HumanTurnRecord] = {}
    played: dict[tuple[str, int], Turn] = {}
    for raw in stored.entries:
        entry = _ENTRY_DECODER.decode(raw)
        if isinstance(entry, FramingEntry):
            progress.framing = progress.framing or entry.turn
        elif isinstance(entry, ChildEntry):
            children[entry.child.child_id] = entry.child
        elif isinstance(entry, PersonEntry):
            people[entry.person.key] = entry.person
        elif isinstance(entry, TurnEntry):
            played.setdefault((entry.turn.speaker, entry.turn.round), entry.turn)
        else:
            _restore_round(progress, entry.round, spec, lenient)
    progress.sub_debates = list(children.values())
    progress.people = tuple(people.values())
    committed = {r.number for r in progress.rounds}
    progress.turns = tuple(t for t in played.values() if t.round not in committed)
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
