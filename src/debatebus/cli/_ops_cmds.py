"""``debatebus replay`` and ``debatebus failures``: what an operator runs after an incident.

``replay`` re-publishes a range of requests, or of dead letters (each onto the topic it came
from). With the checkpoint store it tells finished requests (a stored completed result, or a
failure that is final) from the rest, and skips them unless ``--reemit``: a worker given one again
publishes its stored result again, which chained consumers would take as a second answer. What it
re-publishes without a stored result runs, resuming from its last committed round where it has
one, so only uncommitted work is paid for. ``--dry-run`` says what it would do and changes
nothing. ``failures`` lists an event type's recent failed results and dead letters.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import re
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

import msgspec

from debatebus._durations import duration_s
from debatebus._redaction import redact
from debatebus.checkpoints import CheckpointStore, store_from_url
from debatebus.cli._common import add_broker, positive_int
from debatebus.exceptions import ConfigError
from debatebus.handlers._checkpointing import debate_key, decode_result
from debatebus.schemas.envelope import ENVELOPE_ENCODER, failed_topic, lenient_request
from debatebus.transports import (
    Delivery,
    Outgoing,
    Transport,
    broker_url,
    dlq_topic,
    transport_from_url,
)
from debatebus.transports._base import REASON_HEADER, dead_letter_origin, request_headers

_STREAM_ID = re.compile(r"^\d+(-\d+)?$")
_T = TypeVar("_T")
#: How many store calls a replay keeps in flight at once.
_STORE_CALLS = 64

Position = str | int | datetime | None
#: What a replay does with an entry: re-publish it to ``run`` (no stored result: the debate runs,
#: or resumes), to be answered ``from-store`` (no LLM call), or with its result ``unknown`` (no
#: store consulted); or skip it: finished (``skip-finished``), completed while only failures are
#: replayed (``skip-completed``), or ``unreadable`` (no requestId: a worker would dead-letter it).
Action = Literal["run", "from-store", "unknown", "skip-finished", "skip-completed", "unreadable"]
#: A stored result: completed, failed (a worker answers it from the store again) or failed for
#: good (``"debateRetryable": false``: invalid input, budget reached, drift), which is finished.
Stored = Literal["completed", "failed", "failed-final"]
_PUBLISHED: tuple[Action, ...] = ("run", "from-store", "unknown")
#: A failed result (``event:<type>:failed``) or a dead letter (``<type>:dlq``).
FailureKind = Literal["failed", "dead-letter"]


@dataclass(frozen=True, slots=True)
class ReplayEntry:
    """One entry of the range and what the replay does (or, dry, would do) with it."""

    id: str  #: its position on the broker
    request_id: str | None
    action: Action
    topic: str  #: where it is re-published: a dead letter's origin, else the topic replayed
    dead_letter: bool
    fresh: bool  #: runs afresh under a new debate id (``"replay": "rerun"``)
    stored: Stored | None  #: its stored result; None: none, or no store consulted
    #: Where the store keeps the result that would answer it (``debate_key``); None: unreadable,
    #: or the request asks to run afresh.
    key: str | None = None
    #: A run that is not fresh: whether a committed checkpoint is there to resume from. None:
    #: not looked up (only a dry run looks).
    resumes: bool | None = None
    message: Outgoing | None = field(default=None, repr=False, compare=False)

    def line(self) -> str:
        """``<id>  <requestId>  <what the replay does with it>``, for a dry run's listing."""
        what = {
            "run": "run" + (" afresh" if self.fresh else "")
                   + (", resuming from a committed checkpoint" if self.resumes else ""),
            "from-store": f"answered from the store ({self.stored})",
            "unknown": "re-publish (no store consulted)",
            "skip-finished": f"skip: finished ({self.stored})",
            "skip-completed": "skip: completed (only failures are replayed)",
            "unreadable": "skip: unreadable (no requestId)",
        }[self.action]
        if self.dead_letter and self.action in _PUBLISHED:
            what += f", onto {self.topic}"
        return redact(f"{self.id}  {self.request_id or '-'}  {what}")


@dataclass(slots=True)
class ReplaySummary:
    """What a replay read and did: its ``entries`` in order, and counts over them."""

    entries: list[ReplayEntry] = field(default_factory=list)
    store_consulted: bool = False
    dry_run: bool = False
    only_failed: bool = False
    republished: int = 0

    def count(self, *actions: Action) -> int:
        return sum(1 for entry in self.entries if entry.action in actions)

    @property
    def read(self) -> int:
        return len(self.entries)

    @property
    def to_publish(self) -> int:
        return self.count(*_PUBLISHED)

    @property
    def fresh(self) -> int:
        return sum(1 for e in self.entries if e.action == "run" and e.fresh)

    @property
    def dead_letters(self) -> int:
        return sum(1 for e in self.entries if e.action in _PUBLISHED and e.dead_letter)

    @property
    def resumable(self) -> int | None:
        """Runs with a committed checkpoint to resume from; None unless looked up (a dry run
        with the store)."""
        if not (self.dry_run and self.store_consulted):
            return None
        return sum(1 for e in self.entries if e.action == "run" and e.resumes)

    def line(self) -> str:
        if not self.entries:
            return ("nothing to replay: no entries in that range (check the event type: the name "
                    "workers subscribe to)")
        verb = "dry run, nothing re-published: would re-publish" if self.dry_run else "re-published"
        text = f"read {self.read}: {verb} {self.to_publish}"
        if self.dead_letters:
            text += f" ({self.dead_letters} dead letters, onto the topics they came from)"
        if self.store_consulted:
            text += (f", of which {self.count('from-store')} answered from the store at no LLM "
                     f"cost and {self.count('run')} run")
            resumable = self.resumable
            if resumable is not None:
                text += (f" ({resumable} resuming from a committed checkpoint: only what was not "
                         "committed is paid)")
        else:
            text += (" (checkpoint store not consulted: which already had results is unknown; "
                     "pass --store)")
        if self.fresh:
            text += f"; {self.fresh} run afresh (\"replay\": \"rerun\")"
        skipped = [f"{self.count('unreadable')} unreadable"]
        if self.store_consulted:
            skipped.insert(0, f"{self.count('skip-finished')} finished (a stored completed result "
                              "or final failure; --reemit re-publishes them)")
        if self.only_failed:
            skipped.insert(0, f"{self.count('skip-completed')} completed (not failed)")
        return f"{text}; skipped {', '.join(skipped)}"


def add_parser(sub: Any) -> None:
    replay = sub.add_parser("replay", help="re-publish a range of requests or dead letters")
    replay.add_argument("type", help="event type whose requests to replay, as workers subscribe to "
                        "it (debate:request), or its dead letters (debate:request:dlq)")
    replay.add_argument("--from", dest="start", default=None,
                        help="first entry: a Redis stream id (1700000000000-0), a Kafka offset "
                        "(counted in each partition), or an ISO time (2026-11-30T07:00:00Z); "
                        "default: the beginning")
    replay.add_argument("--to", dest="end", default=None,
                        help="last entry, included (same forms); default: the end")
    replay.add_argument("--partition", dest="partitions", type=_partition, action="append",
                        metavar="N", help="Kafka: only this partition (repeat for more)")
    replay.add_argument("--store", help="checkpoint store URL, to tell finished requests from the "
                        "rest; default: the broker URL when it is Redis")
    replay.add_argument("--dry-run", action="store_true",
                        help="list what would run, be answered from the store or be skipped; "
                        "change nothing")
    replay.add_argument("--failed", action="store_true",
                        help="only requests whose stored result failed or is missing")
    replay.add_argument("--rerun", action="store_true",
                        help='add "replay": "rerun" to each payload: run afresh, new debate id')
    replay.add_argument("--reemit", action="store_true",
                        help="re-publish finished requests too (workers publish their stored "
                        "results again: chained consumers get duplicates)")
    add_broker(replay)
    replay.set_defaults(func=_replay)

    failures = sub.add_parser("failures", help="list recent failed results and dead letters")
    failures.add_argument("type", help="event type, e.g. debate:request")
    failures.add_argument("--since", default="24h",
                          help="how far back: a duration (30m, 1h, 2d) or an ISO time")
    failures.add_argument("--limit", type=positive_int, default=50, metavar="N",
                          help="show the newest N")
    add_broker(failures)
    failures.set_defaults(func=_failures)


def _partition(value: str) -> int:
    """An argparse type: a partition number, 0 or more."""
    if not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"must be a partition number (0, 1, …), not {value!r}")
    return int(value)


def parse_position(value: str | None) -> Position:
    """``None``, an ISO time, a stream id (kept as text) or a Kafka offset (int)."""
    if value is None or value in ("-", "+"):
        return None
    if value.isdigit():
        return int(value)
    if _STREAM_ID.match(value):
        return value
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise _unreadable(value) from None


def _unreadable(value: str) -> ConfigError:
    return ConfigError(f"cannot read position {value!r}: give a stream id (1700000000000-0), an "
                       "offset (42) or an ISO time (2026-11-30T07:00:00Z)")


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """A duration back from ``now`` (``30m``, ``1h``, ``2d``; seconds) or an ISO time."""
    seconds = duration_s(value)
    if seconds is not None:
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        return datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--since {value!r}: give a duration (30m, 1h, 2d) or an ISO time "
                          "(2026-11-30T07:00:00Z)") from None


def _range(transport: Transport, start: Position, end: Position) -> tuple[Any, Any]:
    """``start`` and ``end`` in the form the transport's read_range takes (``position_kind``);
    ``ConfigError`` for a range that ends before it starts, or a Redis stream id on Kafka."""
    first, last = _order_key(start), _order_key(end)
    if first is not None and last is not None and first[0] == last[0] and last[1] < first[1]:
        raise ConfigError(f"the range ends before it starts ({end} comes before {start}): swap "
                          "--from and --to")
    return _for(transport, start, "-"), _for(transport, end, "+")


def _order_key(position: Position) -> tuple[str, Any] | None:
    """How ``position`` compares with another of its kind (a time, an offset, a stream id)."""
    if position is None:
        return None
    if isinstance(position, datetime):
        return "time", position.astimezone()  # a naive time is local, as the brokers read it
    if isinstance(position, int):
        return "offset", position
    if not _STREAM_ID.match(position):
        raise _unreadable(position)
    ms, _, seq = position.partition("-")
    return "id", (int(ms), int(seq or 0))


def _for(transport: Transport, position: Position, open_end: str) -> Any:
    """``position`` as ``transport.read_range`` takes it. A time or a number becomes a bare
    millisecond on a stream, which XRANGE reads as that millisecond's first entry when it starts
    a range and its last when it ends one."""
    if transport.position_kind == "offset":  # Kafka: offsets or times
        if isinstance(position, str):
            raise ConfigError(f"{position!r} is a Redis stream id: on Kafka give an offset (42, "
                              "counted in each partition) or an ISO time (2026-11-30T07:00:00Z)")
        return position
    if position is None:
        return open_end
    if isinstance(position, datetime):
        return str(int(position.timestamp() * 1000))
    return str(position)


@dataclass(frozen=True, slots=True)
class _Read:
    """An entry as read: where it goes, and the store key of the result that would answer it
    (None: unreadable, or a request that asks to run afresh)."""

    delivery: Delivery
    request_id: str | None
    topic: str
    dead_letter: bool
    key: str | None
    asks_rerun: bool


def _read(delivery: Delivery) -> _Read:
    origin = dead_letter_origin(delivery)
    topic = origin or delivery.topic
    request_id, payload = lenient_request(delivery.body)
    asks_rerun = payload.get("replay") == "rerun"
    key = None
    if request_id is not None and not asks_rerun:
        debate_id = payload.get("debateId")
        key = debate_key(topic, debate_id if isinstance(debate_id, str) else request_id)
    return _Read(delivery, request_id, topic, origin is not None, key, asks_rerun)


def _stored_state(result: bytes) -> Stored:
    fields = decode_result(result).fields
    if fields.get("debateStatus") != "failed":
        return "completed"
    return "failed-final" if fields.get("debateRetryable") is False else "failed"


async def _each(call: Callable[[str], Awaitable[_T]], keys: Sequence[str]) -> list[_T]:
    """``call`` of every key, answers in order, at most ``_STORE_CALLS`` in flight."""
    answers: list[_T] = []
    for at in range(0, len(keys), _STORE_CALLS):
        answers += await asyncio.gather(*(call(key) for key in keys[at:at + _STORE_CALLS]))
    return answers


async def _stored_results(store: CheckpointStore, keys: list[str]) -> dict[str, Stored]:
    """The stored result of each key that has one: one call for which do, then one each."""
    if not keys:
        return {}
    have = [key for key, found in zip(keys, await store.has_results(keys), strict=True) if found]
    results = await _each(store.get_result, have)
    return {key: _stored_state(result) for key, result in zip(have, results, strict=True)
            if result is not None}  # expired in between: none stored


def _action(stored: Stored | None, fresh: bool, *, consulted: bool, only_failed: bool,
            reemit: bool) -> Action:
    if not consulted:
        return "run" if fresh else "unknown"
    if stored is None:
        return "run"
    if stored == "completed" and only_failed:
        return "skip-completed"
    if stored in ("completed", "failed-final") and not reemit:
        return "skip-finished"
    return "run" if fresh else "from-store"


def _asking_rerun(body: bytes) -> bytes:
    """``body`` with ``"replay": "rerun"`` in its payload (unchanged if it has no payload object)."""
    try:
        data = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return body
    if not isinstance(data, dict) or not isinstance(data.get("payload"), dict):
        return body
    data["payload"]["replay"] = "rerun"
    return ENVELOPE_ENCODER.encode(data)


def _entry(read: _Read, action: Action, stored: Stored | None, fresh: bool,
           rerun: bool) -> ReplayEntry:
    delivery = read.delivery
    message = None
    if action in _PUBLISHED:
        body = _asking_rerun(delivery.body) if rerun and not read.asks_rerun else delivery.body
        headers = request_headers(delivery.headers) if read.dead_letter else delivery.headers
        message = Outgoing(read.topic, body, delivery.key, headers)
    return ReplayEntry(delivery.id, read.request_id, action, read.topic, read.dead_letter,
                       fresh, stored, read.key, message=message)


async def _with_checkpoints(store: CheckpointStore,
                            entries: list[ReplayEntry]) -> list[ReplayEntry]:
    """``entries`` with ``resumes`` looked up for the runs that are not fresh."""
    todo = [(i, e.key) for i, e in enumerate(entries)
            if e.action == "run" and not e.fresh and e.key is not None]
    found = await _each(store.load, [key for _, key in todo])
    updated = list(entries)
    for (i, _), checkpoint in zip(todo, found, strict=True):
        updated[i] = dataclasses.replace(
            entries[i], resumes=checkpoint is not None and bool(checkpoint.entries))
    return updated


async def replay_range(transport: Transport, event_type: str, *, start: Position = None,
                       end: Position = None, store: CheckpointStore | None = None,
                       progress: Callable[[ReplaySummary, int], None] | None = None,
                       dry_run: bool = False, only_failed: bool = False, rerun: bool = False,
                       reemit: bool = False, partitions: Sequence[int] | None = None,
                       ) -> ReplaySummary:
    """Re-publish the requests of ``event_type`` between ``start`` and ``end`` (inclusive).

    A dead letter goes back onto the topic it came from, as it was first published. With a
    ``store``, a request whose debate finished (stored completed, or failed for good) is skipped
    unless ``reemit``; ``only_failed`` keeps only those whose stored result failed or is missing
    (it needs the store). ``rerun`` adds ``"replay": "rerun"`` to each payload. ``dry_run``
    publishes nothing and looks up which runs would resume from a committed checkpoint.
    ``partitions``: Kafka's to read (offsets count in each). The range is read to its end before
    anything is re-published, so re-publishing to the same stream can't feed the replay its own
    output. ``ConfigError`` for a bad range; ``NotSupportedError`` where the broker keeps no
    history."""
    if only_failed and store is None:
        raise ConfigError("replaying only failed requests needs the checkpoint store, to tell "
                          "them apart: pass --store URL (store=)")
    first, last = _range(transport, start, end)
    reads = [_read(d) async for d in transport.read_range(event_type, first, last,
                                                           partitions=partitions)]
    stored = ({} if store is None else
              await _stored_results(store, [r.key for r in reads if r.key is not None]))
    entries = []
    for read in reads:
        state = stored.get(read.key) if read.key is not None else None
        fresh = read.asks_rerun or rerun
        action: Action = ("unreadable" if read.request_id is None else _action(
            state, fresh, consulted=store is not None, only_failed=only_failed, reemit=reemit))
        entries.append(_entry(read, action, state, fresh, rerun))
    if dry_run and store is not None:
        entries = await _with_checkpoints(store, entries)
    summary = ReplaySummary(entries, store is not None, dry_run, only_failed)
    if not dry_run:
        total = summary.to_publish
        for entry in entries:
            if entry.message is not None:
                await transport.publish(entry.message)
                summary.republished += 1
                if progress is not None:
                    progress(summary, total)
    return summary


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed result or a dead letter of an event type, redacted."""

    time: datetime | None  #: when the broker took it; None where it keeps no time (memory)
    kind: FailureKind
    request_id: str | None  #: None: a dead letter whose body has none
    reason: str  #: the result's ``debateError``, or why the request was dead-lettered
    id: str  #: its position on its topic

    def line(self) -> str:
        """``<time>  <kind>  <requestId>  <reason>``: two spaces apart, one line."""
        when = "-" if self.time is None else self.time.isoformat(timespec="milliseconds")
        reason = " ".join(self.reason.split())  # one line, whatever the error said
        return f"{when.replace('+00:00', 'Z')}  {self.kind}  {self.request_id or '-'}  {reason}"


def _failure(delivery: Delivery, kind: FailureKind) -> Failure:
    request_id, payload = lenient_request(delivery.body)
    if kind == "failed":
        error = payload.get("debateError")
        reason = error if isinstance(error, str) and error else "(the result gives no debateError)"
    else:
        reason = delivery.headers.get(REASON_HEADER) or "(no reason recorded)"
    ms = delivery.timestamp_ms
    return Failure(None if ms is None else datetime.fromtimestamp(ms / 1000, UTC), kind,
                   None if request_id is None else redact(request_id), redact(reason), delivery.id)


async def list_failures(transport: Transport, event_type: str, *, since: datetime | None = None,
                        limit: int | None = None) -> list[Failure]:
    """The failed results (``event:<type>:failed``) and dead letters (``<type>:dlq``) of
    ``event_type`` the broker took since ``since`` (None: all it keeps), oldest first: the newest
    ``limit`` of them. ``NotSupportedError`` where the broker keeps no history (Redis pub/sub)."""
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be at least 1, not {limit}")
    first, last = _range(transport, since, None)
    found: list[Failure] = []
    sources: tuple[tuple[str, FailureKind], ...] = (
        (failed_topic(event_type), "failed"), (dlq_topic(event_type), "dead-letter"))
    for topic, kind in sources:
        newest: deque[Failure] = deque(maxlen=limit)
        async for delivery in transport.read_range(topic, first, last):
            newest.append(_failure(delivery, kind))
        found += newest
    found.sort(key=lambda f: f.time or datetime.min.replace(tzinfo=UTC))
    return found[-limit:] if limit is not None else found


def _progress_bar(summary: ReplaySummary, total: int, width: int = 30) -> None:
    """``[#####.........]  120/400 re-published`` on stderr, redrawn in place on a terminal."""
    done = summary.republished
    if not sys.stderr.isatty() and done not in (total, 1) and done % 500:
        return  # in a log, a line every 500 is plenty
    filled = width * done // max(total, 1)
    line = f"[{'#' * filled}{'.' * (width - filled)}] {done:>6}/{total} re-published"
    end = "\r" if sys.stderr.isatty() and done < total else "\n"
    print(line, end=end, file=sys.stderr, flush=True)


async def _replay(args: argparse.Namespace) -> int:
    url = broker_url(args.broker)
    store_url = args.store or (url if url.startswith(("redis://", "rediss://")) else None)
    store = store_from_url(store_url) if store_url else None
    async with transport_from_url(url) as transport:
        if store is not None:
            await store.connect()
        try:
            summary = await replay_range(
                transport, args.type, start=parse_position(args.start),
                end=parse_position(args.end), store=store, progress=_progress_bar,
                dry_run=args.dry_run, only_failed=args.failed, rerun=args.rerun,
                reemit=args.reemit, partitions=args.partitions)
        finally:
            if store is not None:
                await store.close()
    if args.dry_run:
        for entry in summary.entries:
            print(entry.line())
    print(summary.line())
    return 0


async def _failures(args: argparse.Namespace) -> int:
    since = parse_since(args.since)
    async with transport_from_url(broker_url(args.broker)) as transport:
        # One more than shown, to know whether older ones were left out.
        found = await list_failures(transport, args.type, since=since, limit=args.limit + 1)
    shown = found[-args.limit:]
    if len(found) > len(shown):
        print(f"(older ones left out: the newest {args.limit} are shown; raise --limit)")
    for failure in shown:
        print(failure.line())
    if not shown:
        print(f"no failed results or dead letters of {redact(args.type)} since "
              f"{since.isoformat(timespec='seconds')}")
    return 0
