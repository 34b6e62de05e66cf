"""Redis checkpoint store: shared by every worker, the default when the bus is Redis.

Layout per debate id (values are the caller's opaque bytes)::

    {prefix}:{<id>}:ckpt    list    [header, entry, entry, …], RPUSHed: a round costs its own bytes
                                    (PX retention, set again by each append)
    {prefix}:{<id>}:result  string  final result (PX retention)
    {prefix}:{<id>}:done    string  finished marker, "1" (PX twice the retention)
    {prefix}:{<id>}:lease   string  owner, PX ttl

The braces are literal: ``debatebus:{d1}:ckpt``. They make the debate id the keys' hash tag, so on a
Redis Cluster a debate's keys live in one slot and the scripts that touch several of them
(start, finish) stay legal; single-node Redis ignores them. Every expiry is set by the command,
script or transaction that writes the key: retention costs no round trip of its own.

Each entry element is the caller's entry behind a one-byte tag: ``e`` for a plain entry, or, on the
last entry of each append, ``c`` and the counters (``prompt,completion,total,calls;``). The newest
counters ride on the newest entry, so an append is a single ``RPUSHX`` — no script, no transaction —
and ``RPUSHX`` refuses a debate whose list is gone: a stale worker appending after the final result
replaced the checkpoint cannot resurrect it.

Every operation is one round trip; the ones that must be atomic are one command or a Lua script.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
from typing import Any

from redis.asyncio import Redis

from debatebus._redis import (
    Batcher,
    RedisClient,
    Script,
    build_client,
    describe,
    open_batcher,
    redis_call,
    seed_names,
    url_or_given,
)
from debatebus._retention import DEFAULT_RETENTION_S
from debatebus.checkpoints._base import (
    DEFAULT_TIMEOUT_S,
    CheckpointStore,
    Counters,
    Lease,
    Opening,
    StoredCheckpoint,
    require_entries,
)
from debatebus.checkpoints._common import lease_ttl_ms, marker_ms, not_begun

_PLAIN, _COUNTED = b"e", b"c"

# An expiry of '' means none: kept forever.
_BEGIN = Script("""
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('RPUSH', KEYS[1], ARGV[1])
  if ARGV[2] ~= '' then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
end
return redis.call('LINDEX', KEYS[1], 0)
""")
_ACQUIRE = Script("""
local current = redis.call('GET', KEYS[1])
if current == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
""")
# start(): result if finished; else take (or extend our own) lease, write the header if absent and
# return what is committed and whether an earlier result expired (the finished marker outlived
# it); else report the other owner's lease. One round trip per delivery.
_START = Script("""
local result = redis.call('GET', KEYS[1])
if result then return {1, result} end
local current = redis.call('GET', KEYS[2])
if current and current ~= ARGV[1] then return {2, current, redis.call('PTTL', KEYS[2])} end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
local expired = redis.call('EXISTS', KEYS[4])
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('RPUSH', KEYS[3], ARGV[3])
  if ARGV[4] ~= '' then redis.call('PEXPIRE', KEYS[3], ARGV[4]) end
  return {0, {ARGV[3]}, expired}
end
return {0, redis.call('LRANGE', KEYS[3], 0, -1), expired}
""")
# finish(): the result and its finished marker, the checkpoint it supersedes gone, and our lease
# released, atomically.
_FINISH = Script("""
if ARGV[3] == '' then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[4], '1')
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  redis.call('SET', KEYS[4], '1', 'PX', ARGV[4])
end
redis.call('DEL', KEYS[3])
if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
return 1
""")
_RENEW = Script("""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
""")
_RELEASE = Script("""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""")


def _tagged(entries: list[bytes], counters: Counters) -> list[bytes]:
    c = counters
    counted = b"c%d,%d,%d,%d;" % (c.prompt_tokens, c.completion_tokens, c.total_tokens, c.calls)
    return [*(_PLAIN + bytes(e) for e in entries[:-1]), counted + bytes(entries[-1])]


def _entry_count(debate_id: str, replies: list[Any]) -> list[Any]:
    """RPUSHX's reply (the list's new length, 0 when the list is gone) → the entry count."""
    if not replies[0]:
        raise not_begun(debate_id)
    return [replies[0] - 1]  # the header is element 0


def _checkpoint(elements: list[Any]) -> StoredCheckpoint:
    """The list as stored (header first, then tagged entries) → header, entries, last counters."""
    entries: list[bytes] = []
    counters = Counters()
    for element in elements[1:]:
        raw = bytes(element)
        if raw[:1] == _COUNTED:
            cut = raw.index(b";")
            counters = Counters(*(int(n) for n in raw[1:cut].split(b",")))
            entries.append(raw[cut + 1:])
        else:
            entries.append(raw[1:])
    return StoredCheckpoint(bytes(elements[0]), entries, counters)


def _px(keep_ms: int | None) -> int | str:
    """A script's expiry argument: milliseconds, or '' for none (kept forever)."""
    return "" if keep_ms is None else keep_ms


class RedisCheckpointStore(CheckpointStore):
    """Checkpoints on Redis. ``url_or_client``: a ``redis://``/``rediss://`` URL (the store owns
    and closes its client) or a ``redis.asyncio.Redis`` built with ``decode_responses=False``
    (the caller keeps owning it); ``?cluster=true`` or a ``RedisCluster`` for a Redis Cluster
    (the keys are hash-tagged already). Checkpoints and results are kept ``retention_s`` after their
    last write. Every call is bounded by ``timeout_s``: past it, a ``TransportError`` saying so."""

    def __init__(
        self,
        url_or_client: str | RedisClient,
        *,
        prefix: str = "debatebus",
        retention_s: float = DEFAULT_RETENTION_S,
        connect_timeout: float = 5.0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__(retention_s=retention_s)
        self._url, self._given = url_or_given(url_or_client)
        self.prefix = prefix
        self._connect_timeout = connect_timeout
        self.timeout_s = timeout_s
        self._where = describe(self._url, self._given)
        self._conn: RedisClient | None = None
        self._connecting = asyncio.Lock()
        self._batch: Batcher | None = None

    # ---- plumbing -----------------------------------------------------------------------------

    async def connect(self) -> None:
        await self._client()

    async def _client(self) -> RedisClient:
        if self._conn is not None:
            return self._conn
        async with self._connecting:  # the first debates of a worker all arrive here at once
            if self._conn is None:
                self._conn = await self._open()
            return self._conn

    async def _open(self) -> RedisClient:
        client = self._given or build_client(self._url or "", connect_timeout=self._connect_timeout)
        # The hot-path commands go through the transports' batcher: every call made by any
        # debate in one loop tick is one pipelined round trip.
        try:
            # Fail at startup, with a clear message, not mid-debate.
            batch = await open_batcher(client, self._where, timeout=self.timeout_s,
                                       seeds=seed_names(self._url))
        except BaseException:
            if self._given is None:
                await client.aclose()
            raise
        self._batch = batch
        return client

    async def close(self) -> None:
        batch, self._batch = self._batch, None
        if batch is not None:
            await batch.stop()
        conn, self._conn = self._conn, None
        if conn is not None and self._given is None:
            await conn.aclose()

    def _bounded(self) -> contextlib.AbstractAsyncContextManager[None]:
        """A call that is not batched (the batcher bounds its own pipelines by ``timeout_s``)."""
        return redis_call(self._where, self.timeout_s)

    def _key(self, debate_id: str) -> str:
        return f"{self.prefix}:{{{debate_id}}}:ckpt"

    def _result_key(self, debate_id: str) -> str:
        return f"{self.prefix}:{{{debate_id}}}:result"

    def _lease_key(self, debate_id: str) -> str:
        return f"{self.prefix}:{{{debate_id}}}:lease"

    def _done_key(self, debate_id: str) -> str:
        return f"{self.prefix}:{{{debate_id}}}:done"

    async def _send(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Send commands of one debate in one round trip, as one MULTI/EXEC (nothing
        interleaved), to the server holding its keys (on a cluster, its master)."""

        async def transaction(redis: Redis) -> list[Any]:
            async with redis.pipeline(transaction=True) as pipe:
                for command in commands:
                    pipe.execute_command(*command)
                return await pipe.execute()

        batch = self._batch or await self._batcher()
        async with self._bounded():
            return await batch.on_master(str(commands[0][1]), transaction)

    # ---- checkpoints --------------------------------------------------------------------------

    async def begin(self, debate_id: str, header: bytes, *,
                    retention_s: float | None = None) -> bytes:
        return bytes(await self._batched(_BEGIN, [self._key(debate_id)],
                                         [header, _px(self.keep_ms(retention_s))]))

    async def append(self, debate_id: str, entry: bytes, counters: Counters, *,
                     retention_s: float | None = None) -> int:
        return await self.append_many(debate_id, [entry], counters, retention_s=retention_s)

    async def load(self, debate_id: str) -> StoredCheckpoint | None:
        [elements] = await self._submit(("LRANGE", self._key(debate_id), 0, -1))
        return _checkpoint(elements) if elements else None

    async def size_bytes(self, debate_id: str) -> int:
        # What the server really spends (keys, encodings, allocator overhead), not payload bytes:
        # this is what capacity planning needs. SAMPLES 0 counts every list element exactly.
        key = self._key(debate_id)

        async def usage(redis: Redis) -> Any:
            return await redis.memory_usage(key, samples=0)

        batch = self._batch or await self._batcher()
        async with self._bounded():
            size = await batch.on_master(key, usage)
        return int(size or 0)

    # ---- results ------------------------------------------------------------------------------

    async def put_result(self, debate_id: str, result: bytes, *,
                         retention_s: float | None = None) -> None:
        keep = self.keep_ms(retention_s)
        marker = marker_ms(keep)
        await self._send(
            ("SET", self._result_key(debate_id), result, *(() if keep is None else ("PX", keep))),
            ("SET", self._done_key(debate_id), 1, *(() if marker is None else ("PX", marker))),
            ("DEL", self._key(debate_id)),
        )

    async def result_expired(self, debate_id: str) -> bool:
        done, result = await self._send(("EXISTS", self._done_key(debate_id)),
                                        ("EXISTS", self._result_key(debate_id)))
        return bool(done) and not result

    async def get_result(self, debate_id: str) -> bytes | None:
        [value] = await self._submit(("GET", self._result_key(debate_id)))
        return None if value is None else bytes(value)

    async def has_results(self, debate_ids: list[str]) -> list[bool]:
        # One pipelined EXISTS per id (one round trip) rather than MGET: no result bodies travel.
        keys = [self._result_key(debate_id) for debate_id in debate_ids]
        replies = await self._submit(*(("EXISTS", key) for key in keys))
        return [bool(reply) for reply in replies]

    # ---- leases -------------------------------------------------------------------------------

    async def acquire_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        return await self._lease_script(_ACQUIRE, debate_id, owner, lease_ttl_ms(ttl_s))

    async def renew_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        return await self._lease_script(_RENEW, debate_id, owner, lease_ttl_ms(ttl_s))

    async def release_lease(self, debate_id: str, owner: str) -> None:
        await self._lease_script(_RELEASE, debate_id, owner)

    async def _batcher(self) -> Batcher:
        """The batcher for hot-path commands: every store call made in one loop tick is sent as
        one pipeline."""
        await self._client()
        assert self._batch is not None
        return self._batch

    async def _submit(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Commands pipelined with every other hot-path command of this loop tick (one by one,
        not atomic; on a cluster, each to its key's master)."""
        return await (self._batch or await self._batcher()).submit(commands)

    async def _batched(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        """A hot-path script call, pipelined like every other hot-path command."""
        return await script.run(self._batch or await self._batcher(), keys, args)

    async def _lease_script(self, script: Script, debate_id: str, owner: str, *args: int) -> bool:
        return bool(await self._batched(script, [self._lease_key(debate_id)], [owner, *args]))

    # ---- composite steps: one round trip each ---------------------------------------------------

    def _all_keys(self, debate_id: str) -> list[str]:
        return [self._result_key(debate_id), self._lease_key(debate_id), self._key(debate_id),
                self._done_key(debate_id)]

    async def start(self, debate_id: str, owner: str, ttl_s: float, header: bytes, *,
                    retention_s: float | None = None) -> Opening:
        reply = await self._batched(_START, self._all_keys(debate_id),
                                    [owner, lease_ttl_ms(ttl_s), header,
                                     _px(self.keep_ms(retention_s))])
        if reply[0] == 1:
            return Opening(result=bytes(reply[1]))
        if reply[0] == 2:
            holder = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
            return Opening(lease=Lease(holder, max(int(reply[2]), 0) / 1000))
        checkpoint = _checkpoint(reply[1])
        return Opening(acquired=True, header=checkpoint.header, checkpoint=checkpoint,
                       expired=bool(reply[2]))

    async def append_many(self, debate_id: str, entries: list[bytes], counters: Counters, *,
                          retention_s: float | None = None) -> int:
        require_entries(entries)
        key, keep = self._key(debate_id), self.keep_ms(retention_s)
        # Pipelined with the RPUSHX (no round trip of its own); a no-op when the list is gone.
        expiry = [] if keep is None else [("PEXPIRE", key, keep)]
        batch = self._batch or await self._batcher()
        [count] = await batch.enqueue(
            [("RPUSHX", key, *_tagged(entries, counters)), *expiry],
            check=functools.partial(_entry_count, debate_id))
        return int(count)

    async def finish(self, debate_id: str, owner: str, result: bytes, *,
                     retention_s: float | None = None) -> None:
        keep = self.keep_ms(retention_s)
        await self._batched(_FINISH, self._all_keys(debate_id),
                            [result, owner, _px(keep), _px(marker_ms(keep))])

    async def get_lease(self, debate_id: str) -> Lease | None:
        key = self._lease_key(debate_id)
        owner, pttl = await self._send(("GET", key), ("PTTL", key))
        if owner is None or pttl == -2:
            return None
        # -1 (no expiry) only happens if someone PERSISTed the key by hand: report it as endless.
        remaining = math.inf if pttl == -1 else pttl / 1000
        return Lease(owner.decode() if isinstance(owner, bytes) else str(owner), remaining)
