"""Forks: a new debate that starts from another's first committed rounds, with changes.

``fork(debate, store, parent_id, from_round=K)`` reads the parent from the store (its stored
result when it finished, else its checkpoint), takes its framing and its rounds up to round ``K``,
commits them as the first entries of a new debate's checkpoint and runs ``debate`` from there with
the durable runner: the resume machinery, so the fork calls no model for rounds 1…K and pays only
for what comes after (its counters start at zero). ``debate`` is the parent's definition as
changed (``changed``: other models per participant, a participant added or removed, another
judge's model, more rounds). The fork has an id of its own, is kept next to its parent (same
namespace), and its result says where it came from (``debateForkOf``). The parent's checkpoint
and result are only read.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from debatebus.checkpoints._base import CheckpointStore
from debatebus.engine._definition import DebateSpec, Judge, Participant
from debatebus.engine._result import Progress
from debatebus.engine._run import OnEvent
from debatebus.engine._transcript import Round
from debatebus.exceptions import ConfigError
from debatebus.handlers._checkpointing import (
    debate_key,
    decode_header,
    decode_result,
    judged,
    restore_progress,
)
from debatebus.handlers._durable import DurableRunner
from debatebus.handlers._inputs import Ask, ForkPoint
from debatebus.llm._base import LLM

if TYPE_CHECKING:
    from debatebus.engine._debate import Debate


@dataclasses.dataclass(frozen=True, slots=True)
class ForkBase:
    """What a fork starts from: its parent's question, and its framing and first rounds (with no
    usage or calls counted: they were the parent's)."""

    point: ForkPoint
    question: str
    progress: Progress


def fork_id(parent_id: str) -> str:
    """A new fork's debate id: its parent's, marked, and unique."""
    return f"{parent_id}~fork-{uuid.uuid4().hex[:8]}"


async def fork_base(store: CheckpointStore, namespace: str, point: ForkPoint,
                    spec: DebateSpec) -> ForkBase:
    """Debate ``point.parent_id`` (kept under ``namespace``) cut after round
    ``point.from_round``: from its stored result, else its checkpoint. Verdicts are read with
    ``spec``'s judge (one its schema refuses, another judge's, is kept as JSON). ``ConfigError``
    says what is missing."""
    parent, k = point.parent_id, point.from_round
    if not isinstance(k, int) or k < 0:
        raise ConfigError(f"from_round must be a round number ≥ 0, got {k!r}")
    key = debate_key(namespace, parent)
    data = await store.get_result(key)
    if data is not None:
        stored = decode_result(data)
        if stored.basis is None:
            raise ConfigError(f"the result of debate {parent!r} was stored by a debatebus too old "
                              "to keep its question with it: it cannot be forked")
        rounds = msgspec.convert(stored.fields.get("debateTranscript") or [], list[Round])
        progress = Progress(stored.basis.framing,
                            [judged(r, spec, lenient=True) for r in rounds])
        question = stored.basis.question
    else:
        checkpoint = await store.load(key)
        if checkpoint is None:
            raise ConfigError(f"no debate {parent!r} in {namespace!r} in this store (neither a "
                              "result nor a checkpoint): check the id, the event type it was "
                              "asked on and the store")
        progress = restore_progress(checkpoint, spec, lenient=True)
        question = decode_header(checkpoint.header).question
    numbers = [r.number for r in progress.rounds]
    if k > max(numbers, default=0):
        raise ConfigError(f"debate {parent!r} has committed rounds {numbers or 'none'}: fork "
                          f"from one of them (or 0, its framing only), not round {k}")
    return ForkBase(point, question, Progress(progress.framing,
                                              [r for r in progress.rounds if r.number <= k]))


def changed(debate: Debate, *, models: Mapping[str, LLM] | None = None,
            add: Iterable[Participant] = (), drop: Iterable[str] = (),
            judge_llm: LLM | None = None, max_rounds: int | None = None) -> Debate:
    """``debate`` with changes for a fork: ``models`` by participant name (an added one's too),
    participants added (after the others) or dropped by name, the judge on ``judge_llm`` (a
    judge is added if it had none), another round cap. ``ConfigError`` names what is unknown."""
    added, dropped, models = list(add), set(drop), dict(models or {})
    names = [p.name for p in debate.participants]
    if not dropped <= set(names):
        raise ConfigError(f"cannot drop {sorted(dropped - set(names))}: the participants are "
                          f"{names}")
    kept = [p for p in debate.participants if p.name not in dropped] + added
    unknown = sorted(set(models) - {p.name for p in kept})
    if unknown:
        raise ConfigError(f"no participant {unknown} to give a model to: the participants are "
                          f"{[p.name for p in kept]}")
    participants = [dataclasses.replace(p, llm=models[p.name]) if p.name in models else p
                    for p in kept]
    judge = debate.judge
    if judge_llm is not None:
        judge = Judge(llm=judge_llm) if judge is None else dataclasses.replace(judge,
                                                                               llm=judge_llm)
    return dataclasses.replace(debate, participants=participants, judge=judge,
                               max_rounds=max_rounds or debate.max_rounds)


async def fork(debate: Debate, store: CheckpointStore, parent_id: str, *, from_round: int,
               namespace: str | None = None, debate_id: str | None = None,
               on_event: OnEvent | None = None) -> dict[str, Any]:
    """Run ``debate`` as a fork of debate ``parent_id`` from its round ``from_round``: the
    fork's result fields (``debateForkOf`` names its parent and fork point). ``namespace``: where
    the parent is kept, and the fork with it (the event type it was asked on; default the
    debate's name, as for a direct call). ``debate_id``: the fork's own (default ``fork_id``);
    the same id again resumes, or replays, that fork."""
    where = namespace or debate.name
    base = await fork_base(store, where, ForkPoint(parent_id, from_round), debate.spec)
    ask = Ask.of(base.question, None, debate_id or fork_id(parent_id), "debateId", None, where,
                 fork=base.point)
    return await DurableRunner(debate, store).run(ask, on_event, seed=base.progress)
