"""People in a debate: a participant whose turns a person (or any outside agent) writes.

A ``HumanParticipant`` speaks in its place like any participant; when its turn comes the run asks
its ``PeopleRunner`` for the text, within the person's ``deadline_s``. The engine decides the
turn's key, records the pending turn in the run's progress (so a resumed run waits for the same
turn), emits ``turn_requested``, bounds the wait and applies the failure policy (a missed deadline
or a refusal: a failed turn, or the debate fails in strict mode); *how* the person is reached is
the runner: on a bus, ``debatebus.handlers._people.BusPeople`` publishes a turn request and waits
for the reply (docs/people.md). Outside a bus there is no one to ask unless ``Debate.run(people=)``
is given a runner.

In a debate with people, each turn is committed as it ends (``PlayedTurn``), not only each round:
a worker that dies while a person types resumes without calling again the models that spoke
before the person in that round, and shows the person the same transcript.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

import msgspec

from debatebus.engine._definition import HumanParticipant
from debatebus.engine._rules import DebateFailure
from debatebus.engine._transcript import Round, Turn
from debatebus.exceptions import ConfigError, TransportError
from debatebus.llm._base import Message
from debatebus.schemas import events as ev
from debatebus.schemas.envelope import new_message_id

if TYPE_CHECKING:
    from debatebus.engine._result import Progress
    from debatebus.engine._run import Run

class HumanTurnRecord(msgspec.Struct, kw_only=True):
    """A person's turn that was asked for: kept in the run's progress and checkpoint (committed
    before its request is published), so a resumed run waits for this same turn. ``deadline_at``
    is a wall-clock time (seconds since the epoch): it holds across workers. ``message_id`` is
    the turn request's ``messageId``: only a reply caused by it answers the turn."""

    key: str
    speaker: str
    round: int
    deadline_at: float
    message_id: str


class PlayedTurn(msgspec.Struct, kw_only=True):
    """A turn of a round not yet committed, committed on its own (debates with people)."""

    turn: Turn


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """What a ``PeopleRunner`` asks a person: ``prompt`` (what a model would be asked) and the
    ``transcript`` so far (the committed rounds, then this round's turns), in ``phase`` of round
    ``record.round``. ``progress`` is the run's live progress (a bus runner checkpoints the
    record with its counters)."""

    person: HumanParticipant
    record: HumanTurnRecord
    debate_id: str
    question: str
    phase: str
    prompt: str
    transcript: str
    progress: Progress


class PeopleRunner(Protocol):
    """Reaches a person for one turn and returns their text; raises when they decline (the turn
    fails). The engine bounds the call by the turn's deadline."""

    async def __call__(self, request: TurnRequest) -> str: ...


@dataclass(frozen=True, slots=True)
class NoPeople:
    """The runner of a run that was given none: every person's turn fails, saying how to reach
    them."""

    async def __call__(self, request: TurnRequest) -> str:
        raise ConfigError(f"{request.person.name!r} is a person answering on the bus "
                          f"({request.person.event_type!r}): serve this debate on a bus, or pass "
                          "people=… to Debate.run")


def turn_key(debate_id: str, number: int, speaker: str, sequence: int) -> str:
    """A person's turn key (its request's ``requestId``): the debate, the round, the speaker and
    the how-manieth time they are asked in that round (1 unless a sub-debate re-asks them)."""
    return f"{debate_id}~turn-{number}-{speaker}-{sequence}"


def iso_time(epoch_s: float) -> str:
    """A wall-clock time as the wire writes times (ISO 8601, UTC, milliseconds)."""
    moment = datetime.fromtimestamp(epoch_s, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _record(run: Run, person: HumanParticipant, number: int) -> HumanTurnRecord:
    """The record of ``person``'s turn in round ``number`` this run asks for now: one committed
    before (a resumed run), else a new one. A run asks again in a round only when a sub-debate
    re-asks (a later sequence)."""
    records = run.progress.people
    asked = run.asked
    sequence = asked[person.name, number] = asked.get((person.name, number), 0) + 1
    key = turn_key(run.debate_id, number, person.name, sequence)
    known = next((r for r in records if r.key == key), None)
    if known is not None:
        return known
    record = HumanTurnRecord(key=key, speaker=person.name, round=number,
                             deadline_at=time.time() + person.deadline_s,
                             message_id=new_message_id())
    run.progress.people = (*records, record)
    return record


def _transcript(run: Run, number: int) -> str:
    """The committed rounds, then this round's turns so far (each committed as it ended)."""
    current = [t for t in run.progress.turns if t.round == number]
    return run.full_transcript(Round(number=number, turns=current) if current else None).text


async def hear(run: Run, person: HumanParticipant, purpose: str, number: int,
               message: Message) -> Turn:
    """``person``'s turn: asked of the run's people runner within its deadline. A missed deadline
    or a refusal is a failed turn (strict: the debate fails); a broker's failure is raised (the
    delivery is released and the turn asked for again where it resumes)."""
    record = _record(run, person, number)
    started = time.perf_counter()
    prompt = message.content
    await run.emit(ev.TurnRequested, speaker=person.name, round=number, turn_key=record.key,
                   event_type=person.event_type, message_id=record.message_id,
                   deadline=iso_time(record.deadline_at), prompt=prompt)
    request = TurnRequest(person, record, run.debate_id, run.question, purpose, prompt,
                          _transcript(run, number), run.progress)
    try:
        remaining = record.deadline_at - time.time()
        if remaining <= 0:
            raise TimeoutError
        async with asyncio.timeout(remaining):
            text = await run.people(request)
    except TimeoutError:
        error = f"{person.name} did not answer within the deadline of {person.deadline_s:g} s"
    except TransportError:
        raise  # the broker failed, not the person
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    else:
        await run.emit(ev.TurnCompleted, speaker=person.name, round=number, text=text,
                       model=person.model, duration_ms=(time.perf_counter() - started) * 1000.0)
        return Turn(speaker=person.name, round=number, text=text)
    await run.emit(ev.TurnFailed, speaker=person.name, round=number, text="", error=error,
                   model=person.model, duration_ms=(time.perf_counter() - started) * 1000.0)
    if run.spec.failure_policy == "strict":
        # Running again meets the same deadline (or the same refusal): a final failure.
        raise DebateFailure(f"person {person.name!r} failed in round {number} ({purpose}): "
                            f"{error}", final=True)
    return Turn(speaker=person.name, round=number, text="", failed=True, error=error)
