"""Streamed turns on the bus: a turn's text published while the model writes it, as ``TurnDelta``
events on the events topic, batched by time.

The engine hands each piece of a free-text call's answer to a ``TurnText`` (``on_text``, see
``debatebus.engine._run``); here that is a ``TurnDeltas``, which publishes what arrived at most
at most once a tick (``debatebus.llm._base.tick``: every ``interval_s`` on the loop's clock, the
ticks at which a provider reads its stream, so that a piece read at a tick is published at once),
the first piece at once, one publish of a turn in flight at a time, so its deltas leave in order
and a 500-token turn written in 5 s is about 50 messages, not 500. Its
``commit`` publishes the last delta, ``final``, which makes the turn's text exactly what the
transcript keeps (the model's raw text cleaned: a heading dropped, cut where another speaker
starts): the rest of it, or the whole text, marked ``replace``, when cleaning changed what was
sent already. It is sent before the turn is reported (``turn_completed``).

Deltas are ephemeral: never checkpointed, never replayed. A retried request (its worker died
mid-turn) writes its turns again from their start, and the turns an earlier attempt may have been
streaming are marked ``rerun`` (``TurnStreams``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Final

from debatebus.engine._run import TurnKey
from debatebus.exceptions import ConfigError
from debatebus.llm._base import next_tick, tick
from debatebus.schemas.events import TurnDelta

#: How often a streamed turn's text is published while it is written, at most.
DEFAULT_STREAM_INTERVAL_S: Final = 0.1
#: A retry with no checkpoint store replays the debate from its start: any turn may be a re-run.
_EVERY_ROUND: Final = sys.maxsize

#: Publishes one delta on the events topic (the worker's; it logs a broker error, never raises).
OnDelta = Callable[[TurnDelta], Awaitable[None]]


def check_interval(interval_s: float) -> float:
    if not (0 < interval_s < 60):  # also refuses NaN
        raise ConfigError(f"stream_interval_s must be a number of seconds in (0, 60), got "
                          f"{interval_s!r}: 0.1 publishes a turn about ten times a second")
    return interval_s


class TurnStreams:
    """One request's streamed turns: an ``OnText`` for its run, which publishes each turn through
    ``publish`` once a tick of ``interval_s`` at most (``debatebus.llm._base.tick``).

    ``for_run`` says which turns are re-runs: none on a request's first attempt; on a retry (it
    was delivered before, or its checkpoint was started by another attempt), those an earlier
    attempt may have been streaming. A durable retry resumes after its last committed step and
    may re-run two steps (the one in progress, and the one before when its commit was still
    being written: see ``handlers.durable``); without a checkpoint store it replays every round.
    """

    __slots__ = ("debate_id", "depth", "interval_s", "publish", "redelivered", "request_id",
                 "rerun_through")

    def __init__(self, publish: OnDelta, debate_id: str, request_id: str | None, *,
                 depth: int = 0, interval_s: float = DEFAULT_STREAM_INTERVAL_S,
                 redelivered: bool = False) -> None:
        self.publish = publish
        self.debate_id = debate_id
        self.request_id = request_id
        self.depth = depth
        self.interval_s = interval_s
        self.redelivered = redelivered
        #: The last round whose turns are marked ``rerun`` (None: none are).
        self.rerun_through: int | None = None

    def for_run(self, *, started_before: bool = False,
                committed_rounds: int | None = None) -> TurnStreams:
        """Ready for the run: ``started_before``, another attempt started its checkpoint;
        ``committed_rounds``, the rounds it resumes after (None: no checkpoint store)."""
        if self.redelivered or started_before:
            self.rerun_through = (_EVERY_ROUND if committed_rounds is None
                                  else committed_rounds + 2)
        return self

    def __call__(self, key: TurnKey) -> TurnDeltas:
        rerun = self.rerun_through is not None and key.round <= self.rerun_through
        return TurnDeltas(self, key, rerun)


class TurnDeltas:
    """One writing of one turn, published as ``TurnDelta`` events (a ``TurnText``)."""

    __slots__ = ("_loop", "_pending", "_sending", "_sent", "_sent_tick", "_timer", "closed",
                 "key", "rerun", "seq", "streams")

    def __init__(self, streams: TurnStreams, key: TurnKey, rerun: bool) -> None:
        self.streams = streams
        self.key = key
        self.rerun = rerun
        self.seq = 0
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._pending: list[str] = []  # arrived, not yet published
        self._sent: list[str] = []  # the text published so far
        self._sent_tick: int | None = None  # the tick of the last publish
        self._timer: asyncio.TimerHandle | None = None
        self._sending: asyncio.Task[None] | None = None

    @property
    def interval_s(self) -> float:
        """Pieces are published this often at most: the model may hand them on as seldom."""
        return self.streams.interval_s

    def write(self, piece: str) -> None:
        if self.closed or not piece:
            return
        self._pending.append(piece)
        if self._timer is None and self._sending is None:
            self._schedule()

    def _schedule(self) -> None:
        """Publish what is pending now, or at the next tick when this one had a publish."""
        interval_s, now = self.streams.interval_s, self._loop.time()
        if self._sent_tick is None or tick(now, interval_s) > self._sent_tick:
            self._send()
        else:
            self._timer = self._loop.call_at(next_tick(now, interval_s), self._send)

    def _send(self) -> None:
        self._timer = None
        if self.closed or not self._pending:
            return
        text = "".join(self._pending)
        self._pending.clear()
        self._sent.append(text)
        self._sent_tick = tick(self._loop.time(), self.streams.interval_s)
        self._sending = asyncio.create_task(self._publish(self._delta(text, final=False)))

    async def _publish(self, delta: TurnDelta) -> None:
        try:
            await self.streams.publish(delta)
        finally:
            self._sending = None
            if self._pending and not self.closed and self._timer is None:
                self._schedule()

    def _delta(self, text: str, *, final: bool, replace: bool = False) -> TurnDelta:
        self.seq += 1
        streams, key = self.streams, self.key
        return TurnDelta(
            debate_id=streams.debate_id, seq=self.seq, request_id=streams.request_id,
            depth=streams.depth, round=key.round, speaker=key.speaker, purpose=key.purpose,
            text=text, replace=replace or self.seq == 1, final=final, rerun=self.rerun)

    async def commit(self, text: str) -> None:
        """The last delta: what completes the text sent to ``text`` (the transcript's), or all
        of it, marked ``replace``, when cleaning changed what was sent."""
        if self.closed:
            return
        self.closed = True
        self._cancel_timer()
        if self._sending is not None:
            await asyncio.wait((self._sending,))
        sent = "".join(self._sent)
        if text.startswith(sent):
            delta = self._delta(text[len(sent):], final=True)
        else:
            delta = self._delta(text, final=True, replace=True)
        await self.streams.publish(delta)

    def discard(self) -> None:
        """End the turn without a final delta (its next writing, if any, starts afresh)."""
        if not self.closed:
            self.closed = True
            self._cancel_timer()
            self._pending.clear()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
