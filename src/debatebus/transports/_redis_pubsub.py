"""Redis pub/sub transport (``redis+pubsub://``): Synkro's wire, so a debatebus worker is one
member of a Synkro fleet (Synkro apps and debatebus apps publish, answer and watch each other).

Wire format: ``PUBLISH`` on the channel named by the event type; the message is the JSON envelope
bytes and nothing else (a message's ``key`` and ``headers`` are not transmitted: they live inside
the envelope). The transport declares Synkro's dialect (``debatebus.transports._synkro``): lock
and dedupe keys, metrics counters, the dead-letter list, result and event shapes, as Synkro's own
handlers; ``synkro=None`` keeps debatebus's own rules instead.

**Pub/sub is at-most-once.** Redis keeps nothing: a request published while no worker is
subscribed is gone, and a worker that dies mid-debate loses the request (its lock expires after
the lock TTL; the same requestId published again is then answered). Every subscriber gets every
message (``consume`` ignores ``group``): with Synkro's dialect the lock and dedupe keys make one
of them answer; without it, every worker answers. Use Redis Streams (``redis://``) when requests
must not be lost.

Dead letters of debatebus (a message whose requestId cannot be read, or delivered too often) must
never be lost, so ``reject`` writes them to the Redis *stream* ``{type}:dlq`` in the Streams
transport's format (see ``redis_streams``), and ``publish``/``subscribe`` on a ``…:dlq`` topic
use that stream too. (Synkro's dead-letter list ``synkro:dlq:{type}`` holds failed requests: see
the dialect.) ``reject(requeue=True)`` and ``release`` hand the message back to ``consume`` on
the same topics, in this process only (kept across a ``consume`` that failed and was called
again), after a delay that grows with its deliveries (``backoff.redelivery_delay``).

Redis Cluster (``?cluster=true``): classic ``PUBLISH``/``SUBSCRIBE``, which a cluster relays to
every node, so Synkro apps that ``PUBLISH`` reach debatebus workers subscribed on any node (sharded
``SPUBLISH`` would not reach Synkro's classic subscribers). Each subscription is a redis-py
``ClusterPubSub``; publishes and Synkro's keys go through the slot-routing batcher; the dead-letter
streams are cluster-keyed like the Streams transport's. Synkro's claim runs as single-key steps
there (see ``synkro``).

Databases: Redis pub/sub ignores the db number of the URL. Channels belong to the server, so a
worker on ``/1`` and one on ``/10`` of one Redis both get every ``PUBLISH``; the db scopes only the
keys (Synkro's, the dead-letter streams, heartbeats). A transport given a db other than 0 logs a
WARNING once, when it first connects. Keep fleets apart by event type or by Redis server.

Outages: ``consume`` raises ``TransportError`` when the connection is lost for good or Redis stops
answering (a quiet subscription is checked with ``PING`` after ``command_timeout / 2``); calling
it again subscribes again. What is published while nobody is subscribed is gone: at-most-once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from debatebus._backoff import redelivery_delay
from debatebus._redis import (
    Batcher,
    RedisClient,
    Script,
    build_client,
    check_client,
    cluster_url,
    describe,
    is_cluster,
    open_batcher,
    redis_call,
    seed_names,
)
from debatebus._retention import (
    DEFAULT_RETENTION_S,
    TOPIC_RETENTION_PARAM,
    retention_ms,
    take_retention,
)
from debatebus.exceptions import ConfigError, TransportError
from debatebus.transports._base import NO_HEADERS, Delivery, Outgoing, Transport, heartbeat_key
from debatebus.transports._dialect import DEBATEBUS_WIRE, WireDialect
from debatebus.transports._redis_reads import ReadTracker, log, merge
from debatebus.transports._redis_streams import RedisStreamsTransport
from debatebus.transports._synkro import SYNKRO_DEFAULTS, SynkroDialect, SynkroSettings

_DLQ_SUFFIX = ":dlq"


def _is_dlq(topic: str) -> bool:
    return topic.endswith(_DLQ_SUFFIX)


class RedisPubSubTransport(Transport):
    """Redis pub/sub speaking Synkro's wire; see the module docstring for what it does not promise.

    ``client``: an existing ``redis.asyncio.Redis`` or ``RedisCluster`` (``decode_responses=False``) to
    use instead of building one from ``url``; it is left open by ``close``. ``poll_ms`` bounds
    how long a listener waits before noticing ``close`` or a requeued message. ``synkro``:
    Synkro's lock, dedupe and metrics TTLs and dead-letter switch (``SynkroSettings``, Synkro's
    defaults); None for debatebus's own rules on this channel (every worker answers).
    ``topic_retention_s`` (else the URL's ``?topic_retention=``): how long the dead-letter streams
    keep their entries, as on Redis Streams.
    """

    def __init__(self, url: str = "redis://localhost:6379/0", *, connect_timeout: float = 5.0,
                 command_timeout: float = 10.0, client: RedisClient | None = None,
                 poll_ms: int = 100, synkro: SynkroSettings | None = SYNKRO_DEFAULTS,
                 topic_retention_s: float | None = None) -> None:
        if client is not None:
            check_client(client)
        url, from_url = take_retention(url, TOPIC_RETENTION_PARAM)
        self._topic_retention_s = (topic_retention_s if topic_retention_s is not None
                                   else from_url if from_url is not None else DEFAULT_RETENTION_S)
        retention_ms(self._topic_retention_s, name="topic_retention_s")  # ConfigError now
        self._url = url
        self._connect_timeout = connect_timeout
        self._timeout = command_timeout
        self._poll_s = poll_ms / 1000
        self._client = client
        self._owns_client = client is None
        self._where = describe(url, client)
        self._batcher: Batcher | None = None
        self._dead: RedisStreamsTransport | None = None
        self._reads = ReadTracker()
        self._listeners: set[PubSub] = set()
        #: Requeued and released deliveries by the topics consumed, waiting to be handed out again.
        self._requeued: dict[tuple[str, ...], deque[Delivery]] = {}
        self._closed = False
        self._db_told = False
        #: The beat last written for each (group, consumer): what a last beat takes back.
        self._beats: dict[tuple[str, str], bytes] = {}
        cluster = is_cluster(client) if client is not None else cluster_url(url)
        self._synkro = (SynkroDialect(synkro, lambda: self._parts()[1], cluster=cluster)
                        if synkro is not None else None)

    @property
    def dialect(self) -> WireDialect:
        return self._synkro if self._synkro is not None else DEBATEBUS_WIRE

    async def connect(self) -> None:
        if self._batcher is not None:
            return
        if self._client is None:
            self._client = build_client(self._url, connect_timeout=self._connect_timeout)
        batcher = await open_batcher(self._client, self._where, timeout=self._timeout,
                                     seeds=seed_names(self._url))
        try:
            self._tell_db(self._client)
            dead = RedisStreamsTransport(self._url, client=self._client,
                                         command_timeout=self._timeout,
                                         block_ms=max(1, int(self._poll_s * 1000)),
                                         topic_retention_s=self._topic_retention_s)
            await dead.connect()
        except BaseException:
            await batcher.stop()
            raise
        self._closed = False
        self._dead, self._batcher = dead, batcher

    def _tell_db(self, client: RedisClient) -> None:
        """One WARNING, the first time this transport connects, if its db is not 0: pub/sub
        channels ignore it (a cluster has db 0 only)."""
        if self._db_told or is_cluster(client):
            return
        self._db_told = True
        db = int(client.get_connection_kwargs().get("db") or 0)
        if db:
            log.warning(
                "Redis pub/sub ignores the db number: channels belong to the whole server, so "
                "on %s this transport hears and reaches every PUBLISH of every db, not only db %d's "
                "(the db scopes only its keys: Synkro's locks and dedupe keys, dead letters, "
                "heartbeats); keep fleets apart with their own event types or their own Redis",
                self._where, db)

    async def close(self) -> None:
        self._closed = True
        await self._reads.wait_idle(self._poll_s + 1.0)
        for pubsub in list(self._listeners):  # listeners whose iterator is not being pulled
            await _quietly_close(pubsub)
        self._listeners.clear()
        if self._batcher is not None:
            batcher, self._batcher = self._batcher, None
            await batcher.stop()
        if self._dead is not None:
            dead, self._dead = self._dead, None
            await dead.close()
        if self._client is not None and self._owns_client:
            client, self._client = self._client, None
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await client.aclose()

    async def write_heartbeat(self, group: str, consumer: str, beat: bytes, *,
                              interval_s: float, last: bool = False) -> None:
        """Pub/sub keeps no messages: the keys ``heartbeat_key(group)`` (the group's newest beat)
        and ``heartbeat_key(group, consumer)`` (this consumer's, for ``check --consumer``), SET
        with an expiry that outlives ``debatebus check``'s window by far (a dead worker reads as
        stale, not absent). A last beat deletes this consumer's key, and the group's if it still
        holds the beat this transport last wrote for this consumer (another worker's stays)."""
        _, batcher, _ = self._parts()
        key, own = heartbeat_key(group), heartbeat_key(group, consumer)
        if not last:
            expiry = max(60, int(interval_s * 10))
            await batcher.submit([("SET", key, beat, "EX", expiry), ("SET", own, beat, "EX", expiry)])
            self._beats[group, consumer] = beat
            return
        await batcher.submit([("DEL", own)])
        written = self._beats.pop((group, consumer), None)
        if written is not None:
            # In one step: a GET then a DEL could delete a beat another worker wrote in between.
            await _DELETE_IF_UNCHANGED.run(batcher, [key], [written])

    def _parts(self) -> tuple[RedisClient, Batcher, RedisStreamsTransport]:
        if self._client is None or self._batcher is None or self._dead is None or self._closed:
            raise TransportError("the Redis transport is not connected: call connect() or use async with")
        return self._client, self._batcher, self._dead

    async def publish(self, message: Outgoing) -> str:
        """``PUBLISH`` the body; returns ``""`` (pub/sub has no message ids). A ``…:dlq`` topic is
        a stream, and its entry id is returned."""
        _, batcher, dead = self._parts()
        if _is_dlq(message.topic):
            return await dead.publish(message)
        await batcher.submit((("PUBLISH", message.topic, message.body),))
        return ""

    async def ack(self, delivery: Delivery, results: Sequence[Outgoing] = ()) -> None:
        """Publish ``results``, then (a delivery claimed under Synkro's dialect) mark it answered,
        count it and let its lock go, in the same pipeline; nothing else to acknowledge."""
        _, batcher, dead = self._parts()
        commands = [("PUBLISH", r.topic, r.body) for r in results if not _is_dlq(r.topic)]
        steps = ([commands] if self._synkro is None
                 else self._synkro.settle_steps(delivery, results, commands))
        for step in steps:
            if step:
                await batcher.submit(step)
        if self._synkro is not None:
            self._synkro.settled(delivery)
        for result in results:
            if _is_dlq(result.topic):
                await dead.publish(result)

    async def reject(self, delivery: Delivery, reason: str, *, requeue: bool = False) -> None:
        _, _, dead = self._parts()
        if not requeue:
            await dead.dead_letter(delivery, reason)
            if self._synkro is not None:
                self._synkro.let_go(delivery)
            return
        if not isinstance(delivery.token, deque):
            raise ConfigError("reject(requeue=True) takes deliveries from consume()")
        self.release(delivery)

    def release(self, delivery: Delivery) -> None:
        """Hand the message out again from ``consume``, counted, after ``redelivery_delay``
        (Redis kept no copy of it): a fault that passes within seconds does not use up its
        deliveries at once. Its Synkro lock, if it holds one, is let go, so the copy handed out
        can claim it again."""
        if self._synkro is not None:
            self._synkro.let_go(delivery)
        if isinstance(delivery.token, deque):
            again = Delivery(delivery.topic, delivery.body, delivery.id, delivery.deliveries + 1,
                             delivery.key, delivery.headers, delivery.token)
            asyncio.get_running_loop().call_later(redelivery_delay(delivery.deliveries),
                                                  delivery.token.append, again)

    async def consume(self, topics: Sequence[str], *, group: str, consumer: str,
                      prefetch: int = 16) -> AsyncIterator[Delivery]:
        """Every message on ``topics`` from now on. ``group``, ``consumer`` and ``prefetch`` are
        ignored: pub/sub has no groups, so every subscriber gets every message."""
        if not topics:
            raise ConfigError("consume needs at least one topic")
        await self.connect()
        requeued = self._requeued.setdefault(tuple(topics), deque())
        async for delivery in self._messages(await self._subscribed(topics), topics, requeued):
            yield delivery

    async def subscribe(self, topics: Sequence[str]) -> AsyncIterator[Delivery]:
        await self.connect()
        _, _, dead = self._parts()
        channels = [t for t in topics if not _is_dlq(t)]
        streams = [t for t in topics if _is_dlq(t)]
        sources: list[AsyncIterator[Delivery]] = []
        if channels:
            sources.append(self._messages(await self._subscribed(channels), channels, None))
        if streams:
            sources.append(await dead.subscribe(streams))
        return sources[0] if len(sources) == 1 else merge(*sources)

    async def _subscribed(self, channels: Sequence[str]) -> PubSub:
        """A pub/sub connection whose SUBSCRIBE the server has confirmed: whatever is published
        after this returns reaches it. On a cluster, on the master the slot map names for the
        first channel (a PUBLISH to any node reaches every node's subscribers)."""
        _, batcher, _ = self._parts()

        async def subscribe(redis: Redis) -> PubSub:
            pubsub: PubSub = redis.pubsub()
            self._listeners.add(pubsub)
            try:
                await pubsub.subscribe(*channels)
                for _ in set(channels):
                    # The confirmations come back together, ahead of any message.
                    await pubsub.get_message(timeout=None)
            except BaseException:
                self._listeners.discard(pubsub)
                await _quietly_close(pubsub)
                raise
            return pubsub

        async with redis_call(self._where, self._timeout):
            return await batcher.on_master(channels[0], subscribe)

    async def _messages(self, pubsub: PubSub, channels: Sequence[str],
                        requeued: deque[Delivery] | None) -> AsyncIterator[Delivery]:
        names = {channel.encode(): channel for channel in channels}
        alive = _Liveness(pubsub, self._timeout, self._where)
        try:
            while not self._closed:
                if requeued:
                    yield requeued.popleft()
                    continue
                with self._reads.reading():
                    async with redis_call(self._where, self._timeout + self._poll_s):
                        message: Any = await pubsub.get_message(ignore_subscribe_messages=True,
                                                                timeout=self._poll_s)
                        await alive.check(message)
                if message is not None and message["type"] == "message":
                    yield Delivery(names[message["channel"]], message["data"], "", 1, None,
                                   NO_HEADERS, requeued)
        except TransportError:
            if not self._closed:  # close() pulls the connection from under a blocked read
                raise
        finally:
            self._listeners.discard(pubsub)
            await _quietly_close(pubsub)


class _Liveness:
    """A subscription that hears nothing can't tell a quiet channel from a dead or frozen server:
    after ``timeout / 2`` of silence it sends ``PING``, and fails if the pong (or anything else)
    does not arrive within ``timeout / 2`` more."""

    def __init__(self, pubsub: PubSub, timeout: float, where: str) -> None:
        self._pubsub = pubsub
        self._half = timeout / 2
        self._where = where
        self._heard = time.monotonic()
        self._pinged: float | None = None

    async def check(self, message: Any) -> None:
        now = time.monotonic()
        if message is not None:
            self._heard, self._pinged = now, None
        elif self._pinged is not None:
            if now - self._pinged > self._half:
                raise TransportError(f"Redis at {self._where} did not answer a PING within "
                                     f"{self._half:g} s: check the server, or raise command_timeout")
        elif now - self._heard > self._half:
            await self._pubsub.ping()
            self._pinged = now


#: Deletes the group's newest beat (KEYS[1]) only if it is still ARGV[1], byte for byte.
_DELETE_IF_UNCHANGED = Script("""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""")


async def _quietly_close(pubsub: PubSub) -> None:
    with contextlib.suppress(redis_errors.RedisError, OSError):
        await pubsub.aclose()  # type: ignore[no-untyped-call]
