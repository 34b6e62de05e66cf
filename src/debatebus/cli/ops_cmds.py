"""``debatebus replay``: re-publish a range of requests, paying nothing for finished debates.

Finished debates are answered from the checkpoint store (``debateReplayed: true``) with zero LLM
calls, so replaying a whole topic after an incident only costs what never finished.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from debatebus.checkpoints import CheckpointStore, store_from_url
from debatebus.cli.common import add_broker, broker_url
from debatebus.exceptions import ConfigError
from debatebus.handlers.checkpointing import debate_key
from debatebus.schemas.envelope import lenient_request
from debatebus.transports import Delivery, Outgoing, Transport, transport_from_url

__all__ = ["ReplaySummary", "add_parser", "parse_position", "replay_range"]

_STREAM_ID = re.compile(r"^\d+(-\d+)?$")
Position = str | int | datetime | None


@dataclass(slots=True)
class ReplaySummary:
    read: int = 0
    republished: int = 0
    already_finished: int = 0
    reruns: int = 0
    unreadable: int = 0

    def line(self) -> str:
        return (f"read {self.read}, re-published {self.republished}, of which "
                f"{self.already_finished} already had results (answered from the store at no LLM "
                f"cost) and {self.reruns} ask for a rerun (\"replay\": \"rerun\", run again in "
                f"full); {self.unreadable} unreadable skipped")


def add_parser(sub: Any) -> None:
    replay = sub.add_parser("replay", help="re-publish a range of requests from a stream/topic")
    replay.add_argument("type", help="event type whose requests to replay, e.g. debate:request")
    replay.add_argument("--from", dest="start", default=None,
                        help="first entry: a Redis stream id (1700000000000-0), a Kafka offset, or "
                        "an ISO time (2026-11-30T07:00:00Z); default: the beginning")
    replay.add_argument("--to", dest="end", default=None, help="last entry (same forms)")
    replay.add_argument("--store", help="checkpoint store URL, to report finished debates "
                        "(default: the broker URL when it is Redis)")
    add_broker(replay)
    replay.set_defaults(func=_replay)


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
        raise ConfigError(
            f"cannot read position {value!r}: give a stream id (1700000000000-0), an offset (42) "
            "or an ISO time (2026-11-30T07:00:00Z)"
        ) from None


def _entries(transport: Transport, topic: str, start: Position, end: Position
             ) -> AsyncIterator[Delivery]:
    """``read_range`` (NotSupportedError, a ConfigError, where the broker keeps no history)."""
    return transport.read_range(topic, _for(transport, start, "-"), _for(transport, end, "+"))


def _for(transport: Transport, position: Position, open_end: str) -> Any:
    """Positions in the form the transport's read_range takes (its ``position_kind``)."""
    if transport.position_kind == "offset":  # Kafka: offsets or times
        return position
    if position is None:
        return open_end
    if isinstance(position, datetime):
        return f"{int(position.timestamp() * 1000)}-0"
    return f"{position}-0" if isinstance(position, int) else position


def _stored_debate_id(body: bytes) -> tuple[bool, str | None]:
    """(readable, the debate whose stored result would answer it): its payload's debateId, else
    its requestId; None for a ``"replay": "rerun"`` request, which runs afresh under a new id."""
    request_id, payload = lenient_request(body)
    if request_id is None:
        return False, None
    if payload.get("replay") == "rerun":
        return True, None
    debate_id = payload.get("debateId")
    return True, debate_id if isinstance(debate_id, str) else request_id


async def replay_range(transport: Transport, event_type: str, *, start: Position = None,
                       end: Position = None, store: CheckpointStore | None = None,
                       progress: Callable[[ReplaySummary, int], None] | None = None,
                       ) -> ReplaySummary:
    """Re-publish every readable request of ``event_type`` between ``start`` and ``end``.

    The range is read to its end before anything is re-published, so re-publishing to the same
    stream can't feed the replay its own output."""
    summary = ReplaySummary()
    batch: list[Delivery] = []
    stored_ids: list[str] = []
    async for delivery in _entries(transport, event_type, start, end):
        summary.read += 1
        readable, debate_id = _stored_debate_id(delivery.body)
        if not readable:
            summary.unreadable += 1
            continue
        batch.append(delivery)
        if debate_id is None:
            summary.reruns += 1
        else:
            stored_ids.append(debate_key(event_type, debate_id))
    if store is not None and stored_ids:
        summary.already_finished = sum(await store.has_results(stored_ids))
    for delivery in batch:
        await transport.publish(Outgoing(event_type, delivery.body, delivery.key, delivery.headers))
        summary.republished += 1
        if progress is not None:
            progress(summary, len(batch))
    return summary


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
            summary = await replay_range(transport, args.type, start=parse_position(args.start),
                                         end=parse_position(args.end), store=store,
                                         progress=_progress_bar)
        finally:
            if store is not None:
                await store.close()
    print(summary.line())
    return 0
