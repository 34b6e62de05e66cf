"""Worker heartbeats, read by ``debatebus check`` (container healthchecks).

Every ``interval_s`` a worker announces itself with a small JSON object — app, group, consumer,
host, pid, ``inFlight``, ``intervalS``, ``connected`` (false while its consumer cannot reach the
broker) and ``timestamp`` (seconds since the epoch) — through its transport's
``write_heartbeat``, which stores it where ``latest_heartbeat`` finds it:

* Redis Streams: an entry of the stream ``debatebus:heartbeat`` in the usual wire format (field
  ``envelope``, so ``debatebus tail debatebus:heartbeat`` shows them), trimmed to about
  ``HEARTBEAT_STREAM_MAXLEN`` entries;
* Redis pub/sub keeps nothing, so instead the key ``debatebus:heartbeat:{group}`` (SET with an
  expiry);
* Kafka: a record of the topic ``debatebus.heartbeat``, keyed by group;
* memory: nothing; no other process could read it.

``latest_heartbeat`` on a Redis URL reads both the stream and the key, so ``check`` works whichever
of the two Redis transports the workers use. Given a consumer, it looks for that consumer's newest
beat only (on pub/sub, its own key ``debatebus:heartbeat:{group}:consumer:{consumer}``), so a
container's health check follows its own worker, not the group. It answers within its ``timeout``,
closing its connections included, or raises ``TimeoutError``.

A beat that cannot be written is not written: during an outage the newest beat goes stale. A worker
that stops cleanly says so at once (``send_last_beat``): it deletes its pub/sub key, or writes a
last beat with ``stopping: true``; ``latest_heartbeat`` skips every consumer whose newest beat is
such a last one, so ``check`` sees the group's remaining workers, or none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from debatebus._redaction import redact
from debatebus.exceptions import ConfigError, NotSupportedError, TransportError
from debatebus.transports import redis_server_url
from debatebus.transports._base import (
    HEARTBEAT_TOPIC,
    Transport,
    heartbeat_key,
)

if TYPE_CHECKING:
    from debatebus._redis import Batcher

log = logging.getLogger("debatebus.heartbeat")

#: How far back to look for a group's newest beat among other groups' beats: pages of _PAGE.
_PAGE: Final = 100
_MAX_PAGES: Final = 10
#: The most of a check's time kept for closing its connections (seconds).
_CLOSE_S: Final = 0.5

Beat = dict[str, Any]


def _beat(app: str, group: str, consumer: str, interval_s: float, inflight: int, *,
          connected: bool = True, stopping: bool = False) -> bytes:
    beat = {
        "app": app, "group": group, "consumer": consumer, "host": socket.gethostname(),
        "pid": os.getpid(), "inFlight": inflight, "intervalS": interval_s,
        "connected": connected, "timestamp": time.time(),
    }
    if stopping:
        beat["stopping"] = True
    return json.dumps(beat).encode()


def _decode(raw: bytes | str | None) -> Beat | None:
    """A heartbeat, or None for anything else (someone else's entry, a truncated write…)."""
    if not raw:
        return None
    try:
        beat = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(beat, dict) or not isinstance(beat.get("timestamp"), int | float):
        return None
    return beat


def _newest(beats: list[Beat | None]) -> Beat | None:
    found = [b for b in beats if b is not None]
    return max(found, key=lambda b: float(b["timestamp"])) if found else None


class _Live:
    """Reads one group's beats newest first (only ``consumer``'s, when given) and keeps the first
    from a consumer that is still running: a consumer's newest beat decides, and a last beat
    (``stopping``) rules it out."""

    def __init__(self, group: str, consumer: str | None = None) -> None:
        self.group = group
        self.consumer = consumer
        self.seen: set[str] = set()

    @property
    def done(self) -> bool:
        """Whether reading on could change the answer: not once the one consumer asked for was
        seen (its newest beat decided)."""
        return self.consumer is not None and self.consumer in self.seen

    def pick(self, beat: Beat | None) -> Beat | None:
        if beat is None or beat.get("group") != self.group:
            return None
        consumer = str(beat.get("consumer"))
        if consumer in self.seen or self.consumer not in (None, consumer):
            return None
        self.seen.add(consumer)
        return None if beat.get("stopping") else beat


# ---- publishing -------------------------------------------------------------------------------


async def beat_forever(transport: Transport, group: str, consumer: str, interval_s: float,
                       inflight: Callable[[], int], *, app: str = "debatebus",
                       connected: Callable[[], bool] = lambda: True,
                       wake: asyncio.Event | None = None) -> None:
    """Publish a heartbeat now and every ``interval_s`` until cancelled, and at once whenever
    ``wake`` is set (a worker that reconnected says so without waiting). A broker outage is
    logged once and retried: a missing heartbeat is how ``check`` learns of it. Returns at once
    on a transport that keeps no heartbeats (memory)."""
    if interval_s <= 0:
        raise ConfigError(f"heartbeat interval must be > 0 s, got {interval_s}")
    wake = wake or asyncio.Event()
    failing = False
    while True:
        wake.clear()
        try:
            beat = _beat(app, group, consumer, interval_s, inflight(), connected=connected())
            await transport.write_heartbeat(group, consumer, beat, interval_s=interval_s)
        except NotSupportedError:  # memory: nobody else could read it
            return
        except TransportError as exc:
            if not failing:
                log.warning("could not publish a heartbeat (retrying every %g s): %s", interval_s, exc)
            failing = True
        else:
            if failing:
                log.info("publishing heartbeats again")
            failing = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), interval_s)


async def send_last_beat(transport: Transport, group: str, consumer: str, interval_s: float, *,
                         app: str = "debatebus") -> None:
    """Say that this consumer stopped, so ``check`` stops counting it at once: a last beat with
    ``stopping: true`` (on Redis pub/sub, this consumer's key is deleted, and the group's when
    it holds this consumer's beat). Raises ``TransportError`` when the broker cannot be reached."""
    beat = _beat(app, group, consumer, interval_s, 0, stopping=True)
    with contextlib.suppress(NotSupportedError):
        await transport.write_heartbeat(group, consumer, beat, interval_s=interval_s, last=True)


# ---- reading ----------------------------------------------------------------------------------


async def latest_heartbeat(url: str, group: str, consumer: str | None = None, *,
                           timeout: float = 5.0) -> Beat | None:
    """The newest heartbeat of ``group`` (of its ``consumer`` only, when given) on the broker at
    ``url``, or None when there is none. Done within ``timeout`` seconds, closing its connections
    included; ``TimeoutError`` past it."""
    scheme = urlsplit(url).scheme
    deadline = asyncio.get_running_loop().time() + timeout
    server = redis_server_url(url)
    if server is not None:
        return await _redis_latest(server, group, consumer, deadline)
    if scheme == "kafka":
        from debatebus.transports.kafka._settings import url_options

        return await _kafka_latest(url_options(url)[0], group, consumer, deadline)
    if scheme == "memory":
        raise ConfigError("memory:// lives inside one process: no other process can see its "
                          "heartbeats; check a worker on Redis or Kafka")
    raise ConfigError(f"unsupported broker URL {redact(url)!r}: use redis://, redis+pubsub:// or kafka://")


async def _bounded(deadline: float, work: Callable[[], Awaitable[Beat | None]],
                   close: Callable[[], Awaitable[object]]) -> Beat | None:
    """``work()`` then ``close()``, both done by ``deadline`` (loop time): the work may use all
    but a last slice of the time left (a tenth, at most ``_CLOSE_S``), kept for closing, which
    is given up at the deadline (the process is about to exit, or the caller to go on)."""
    left = deadline - asyncio.get_running_loop().time()
    try:
        async with asyncio.timeout_at(deadline - min(_CLOSE_S, left / 10)):
            return await work()
    finally:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await close()


async def _redis_latest(url: str, group: str, consumer: str | None,
                        deadline: float) -> Beat | None:
    from debatebus._redis import build_client, describe, make_batcher, seed_names

    left = deadline - asyncio.get_running_loop().time()
    client = build_client(url, connect_timeout=max(0.1, min(5.0, left)))
    batch = make_batcher(client, describe(url), timeout=max(0.1, left), seeds=seed_names(url))
    batch.start()

    async def newest() -> Beat | None:
        [raw] = await batch.submit([("GET", heartbeat_key(group, consumer))])
        from_key = _Live(group, consumer).pick(_decode(raw))
        return _newest([from_key, await _scan_stream(batch, _Live(group, consumer))])

    async def close() -> None:
        await batch.stop()
        await client.aclose()

    return await _bounded(deadline, newest, close)


async def _scan_stream(batch: Batcher, live: _Live) -> Beat | None:
    """Newest first, page by page: other groups' beats may sit on top of this group's."""
    from debatebus.transports._redis_entries import ENVELOPE, field_map

    end = "+"
    for _ in range(_MAX_PAGES):
        [entries] = await batch.submit([("XREVRANGE", HEARTBEAT_TOPIC, end, "-", "COUNT", _PAGE)])
        for _id, fields in entries:
            beat = live.pick(_decode(field_map(fields).get(ENVELOPE)))
            if beat is not None or live.done:
                return beat
        if len(entries) < _PAGE:
            return None
        last = entries[-1][0]
        end = "(" + (last.decode() if isinstance(last, bytes) else str(last))
    return None


async def _kafka_latest(servers: str, group: str, consumer: str | None,
                        deadline: float) -> Beat | None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import KafkaError

    from debatebus.transports.kafka import kafka_topic

    left_ms = int((deadline - asyncio.get_running_loop().time()) * 1000)
    # No request of the reader's may outlive the check (aiokafka's default waits 40 s).
    reader = AIOKafkaConsumer(bootstrap_servers=servers, group_id=None,
                              enable_auto_commit=False, client_id="debatebus-check",
                              request_timeout_ms=max(1000, left_ms), fetch_max_wait_ms=100)

    async def newest() -> Beat | None:
        try:
            await reader.start()
            return await _kafka_newest(reader, kafka_topic(HEARTBEAT_TOPIC), group, consumer)
        except KafkaError as exc:
            raise TransportError(f"Kafka at {servers}: reading heartbeats failed "
                                 f"({type(exc).__name__}: {exc}); is a broker listening "
                                 "there?") from exc

    return await _bounded(deadline, newest, reader.stop)


async def _kafka_newest(reader: Any, topic: str, group: str, consumer: str | None,
                        ) -> Beat | None:
    from aiokafka import TopicPartition

    if topic not in await reader.topics():
        return None
    tps = [TopicPartition(topic, p) for p in sorted(reader.partitions_for_topic(topic) or ())]
    reader.assign(tps)
    begins, ends = await reader.beginning_offsets(tps), await reader.end_offsets(tps)
    return _newest([await _partition_newest(reader, tp, begins[tp], ends[tp],
                                            _Live(group, consumer)) for tp in tps])


async def _partition_newest(reader: Any, tp: Any, begin: int, end: int, live: _Live) -> Beat | None:
    """Pages back from the end: a group's beats all land on one partition (keyed by group), and
    its newest is near that partition's end unless other groups share it."""
    high = end
    for _ in range(_MAX_PAGES):
        if high <= begin or live.done:
            return None
        low = max(begin, high - _PAGE)
        values = await _read_offsets(reader, tp, low, high)
        for value in reversed(values):
            found = live.pick(_decode(value))
            if found is not None or live.done:
                return found
        high = low
    return None


async def _read_offsets(reader: Any, tp: Any, low: int, high: int) -> list[bytes]:
    reader.seek(tp, low)
    values: list[bytes] = []
    idle = 0
    while await reader.position(tp) < high and idle < 20:  # a gap (compaction) ends it too
        batch = await reader.getmany(tp, timeout_ms=250)
        records = batch.get(tp, [])
        idle = 0 if records else idle + 1
        values += [r.value for r in records if r.offset < high]
    return values
