"""Redis checkpoint store: shared by every worker, the default when the bus is Redis.

Layout per debate id (values are the caller's opaque bytes)::

    {prefix}:ckpt:{id}:h    hash    header + counters (prompt_tokens, completion_tokens, ...)
    {prefix}:ckpt:{id}:r    list    entries, RPUSHed: a round costs its own bytes, never a rewrite
    {prefix}:result:{id}    string  final result (PX result_ttl when set)
    {prefix}:lease:{id}     string  owner, PX ttl

Every operation is one round trip; the ones that must be atomic are MULTI/EXEC or a Lua script.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from debatebus.checkpoints._common import lease_ttl_ms, not_begun, result_ttl_ms
from debatebus.checkpoints.base import (
    CheckpointStore,
    Counters,
    Lease,
    Opening,
    StoredCheckpoint,
)
from debatebus.exceptions import TransportError
from debatebus.transports.redis_common import (
    CommandBatcher,
    build_client,
    check_client,
    describe,
    map_redis_errors,
)

__all__ = ["RedisCheckpointStore"]

_HEADER = b"header"
_COUNTER_FIELDS = (b"prompt_tokens", b"completion_tokens", b"total_tokens", b"calls")

# A Lua script rather than MULTI so an append can refuse a debate with no header: a stale worker
# appending after put_result() must not resurrect a headerless checkpoint that never expires.
_APPEND = """
if redis.call('HEXISTS', KEYS[1], 'header') == 0 then return -1 end
local n = redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'prompt_tokens', ARGV[2], 'completion_tokens', ARGV[3],
           'total_tokens', ARGV[4], 'calls', ARGV[5])
return n
"""
_ACQUIRE = """
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
"""
# start(): result if finished; else take (or extend our own) lease, write the header if absent and
# return what is committed; else report the other owner's lease. One round trip per delivery.
_START = """
local result = redis.call('GET', KEYS[1])
if result then return {1, result} end
local current = redis.call('GET', KEYS[2])
if current and current ~= ARGV[1] then return {2, current, redis.call('PTTL', KEYS[2])} end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('HSETNX', KEYS[3], 'header', ARGV[3])
return {0, redis.call('HGETALL', KEYS[3]), redis.call('LRANGE', KEYS[4], 0, -1)}
"""
_APPEND_MANY = """
if redis.call('HEXISTS', KEYS[1], 'header') == 0 then return -1 end
local n = redis.call('RPUSH', KEYS[2], unpack(ARGV, 5))
redis.call('HSET', KEYS[1], 'prompt_tokens', ARGV[1], 'completion_tokens', ARGV[2],
           'total_tokens', ARGV[3], 'calls', ARGV[4])
return n
"""
# finish(): the result, the checkpoint it supersedes gone, and our lease released, atomically.
_FINISH = """
if ARGV[3] == '' then redis.call('SET', KEYS[1], ARGV[1])
else redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3]) end
redis.call('DEL', KEYS[3], KEYS[4])
if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
return 1
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class _Scripts:
    """The Lua scripts, registered once per client (redis-py reloads them after a restart)."""

    def __init__(self, client: Redis) -> None:
        self.append: AsyncScript = client.register_script(_APPEND)
        self.acquire: AsyncScript = client.register_script(_ACQUIRE)
        self.renew: AsyncScript = client.register_script(_RENEW)
        self.release: AsyncScript = client.register_script(_RELEASE)
        self.start: AsyncScript = client.register_script(_START)
        self.append_many: AsyncScript = client.register_script(_APPEND_MANY)
        self.finish: AsyncScript = client.register_script(_FINISH)


class RedisCheckpointStore(CheckpointStore):
    """Checkpoints on Redis. ``url_or_client``: a ``redis://``/``rediss://`` URL (the store owns
    and closes its client) or a ``redis.asyncio.Redis`` built with ``decode_responses=False``
    (the caller keeps owning it). ``result_ttl_s`` makes final results expire (None: never)."""

    def __init__(
        self,
        url_or_client: str | Redis,
        *,
        prefix: str = "debatebus",
        result_ttl_s: float | None = None,
        connect_timeout: float = 5.0,
    ) -> None:
        if isinstance(url_or_client, str):
            self._url: str | None = url_or_client
            self._given: Redis | None = None
        else:
            check_client(url_or_client)
            self._url, self._given = None, url_or_client
        self.prefix = prefix
        self._result_ttl_ms = result_ttl_ms(result_ttl_s)
        self._connect_timeout = connect_timeout
        self._where = describe(self._url, self._given)
        self._conn: tuple[Redis, _Scripts] | None = None
        self._batch: CommandBatcher | None = None

    # ---- plumbing -----------------------------------------------------------------------------

    async def connect(self) -> None:
        await self._client()

    async def _client(self) -> tuple[Redis, _Scripts]:
        if self._conn is not None:
            return self._conn
        client = self._given or build_client(self._url or "", connect_timeout=self._connect_timeout)
        try:
            with map_redis_errors(self._where):
                await client.ping()  # fail at startup, with a clear message, not mid-debate
        except BaseException:
            if self._given is None:
                await client.aclose()
            raise
        if self._conn is not None:  # another task connected while we pinged: keep theirs
            if self._given is None:
                await client.aclose()
            return self._conn
        scripts = _Scripts(client)
        await self._load_scripts(client, scripts)
        # The hot-path scripts go through the transports' batcher: every call made by any debate
        # in one loop tick is one pipelined round trip.
        self._batch = CommandBatcher(client, self._where, transaction=False, timeout=30.0)
        self._batch.start()
        self._conn = (client, scripts)
        return self._conn

    async def _load_scripts(self, client: Redis, scripts: _Scripts) -> None:
        with map_redis_errors(self._where):  # batched calls send EVALSHA only
            for script in (scripts.start, scripts.append_many, scripts.finish, scripts.renew):
                script.sha = await client.script_load(script.script)

    async def close(self) -> None:
        batch, self._batch = self._batch, None
        if batch is not None:
            await batch.stop()
        conn, self._conn = self._conn, None
        if conn is not None and self._given is None:
            await conn[0].aclose()

    def _keys(self, debate_id: str) -> tuple[str, str]:
        base = f"{self.prefix}:ckpt:{debate_id}"
        return f"{base}:h", f"{base}:r"

    def _result_key(self, debate_id: str) -> str:
        return f"{self.prefix}:result:{debate_id}"

    def _lease_key(self, debate_id: str) -> str:
        return f"{self.prefix}:lease:{debate_id}"

    async def _send(self, *commands: tuple[Any, ...], transaction: bool = True) -> list[Any]:
        """Send commands in one round trip; as one MULTI/EXEC (nothing interleaved) by default."""
        redis, _ = await self._client()
        with map_redis_errors(self._where):
            async with redis.pipeline(transaction=transaction) as pipe:
                for command in commands:
                    pipe.execute_command(*command)
                return await pipe.execute()

    # ---- checkpoints --------------------------------------------------------------------------

    async def begin(self, debate_id: str, header: bytes) -> bytes:
        h, _ = self._keys(debate_id)
        _, stored = await self._send(("HSETNX", h, _HEADER, header), ("HGET", h, _HEADER))
        return bytes(stored)

    async def append(self, debate_id: str, entry: bytes, counters: Counters) -> int:
        _, scripts = await self._client()
        args = (entry, counters.prompt_tokens, counters.completion_tokens, counters.total_tokens,
                counters.calls)
        with map_redis_errors(self._where):
            count = int(await scripts.append(keys=self._keys(debate_id), args=args))
        if count < 0:
            raise not_begun(debate_id)
        return count

    async def load(self, debate_id: str) -> StoredCheckpoint | None:
        h, r = self._keys(debate_id)
        fields, entries = await self._send(("HGETALL", h), ("LRANGE", r, 0, -1))
        if _HEADER not in fields:
            return None
        counters = Counters(*(int(fields.get(name, 0)) for name in _COUNTER_FIELDS))
        return StoredCheckpoint(bytes(fields[_HEADER]), [bytes(e) for e in entries], counters)

    async def size_bytes(self, debate_id: str) -> int:
        # What the server really spends (keys, encodings, allocator overhead), not payload bytes:
        # this is what capacity planning needs. SAMPLES 0 counts every list element exactly.
        h, r = self._keys(debate_id)
        sizes = await self._send(
            ("MEMORY", "USAGE", h, "SAMPLES", 0), ("MEMORY", "USAGE", r, "SAMPLES", 0)
        )
        return sum(int(size or 0) for size in sizes)

    # ---- results ------------------------------------------------------------------------------

    async def put_result(self, debate_id: str, result: bytes) -> None:
        expiry = () if self._result_ttl_ms is None else ("PX", self._result_ttl_ms)
        await self._send(
            ("SET", self._result_key(debate_id), result, *expiry),
            ("DEL", *self._keys(debate_id)),
        )

    async def get_result(self, debate_id: str) -> bytes | None:
        [value] = await self._send(("GET", self._result_key(debate_id)), transaction=False)
        return None if value is None else bytes(value)

    async def has_results(self, debate_ids: list[str]) -> list[bool]:
        # One pipelined EXISTS per id (one round trip) rather than MGET: no result bodies travel.
        keys = [self._result_key(debate_id) for debate_id in debate_ids]
        replies = await self._send(*(("EXISTS", key) for key in keys), transaction=False)
        return [bool(reply) for reply in replies]

    # ---- leases -------------------------------------------------------------------------------

    async def acquire_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        return await self._lease_script("acquire", debate_id, owner, lease_ttl_ms(ttl_s))

    async def renew_lease(self, debate_id: str, owner: str, ttl_s: float) -> bool:
        reply = await self._batched("renew", [self._lease_key(debate_id)],
                                    [owner, lease_ttl_ms(ttl_s)])
        return bool(reply)

    async def release_lease(self, debate_id: str, owner: str) -> None:
        await self._lease_script("release", debate_id, owner)

    async def _batched(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """A hot-path script call, pipelined with every other made in the same loop tick."""
        client, scripts = await self._client()
        assert self._batch is not None
        command = ("EVALSHA", getattr(scripts, name).sha, len(keys), *keys, *args)
        try:
            [reply] = await self._batch.submit([command])
        except TransportError as exc:
            if not isinstance(exc.__cause__, NoScriptError):
                raise
            await self._load_scripts(client, scripts)  # Redis restarted and forgot them
            [reply] = await self._batch.submit([command])
        return reply

    async def _lease_script(
        self, name: Literal["acquire", "renew", "release"], debate_id: str, owner: str, *args: int
    ) -> bool:
        _, scripts = await self._client()
        script: AsyncScript = getattr(scripts, name)
        with map_redis_errors(self._where):
            reply = await script(keys=[self._lease_key(debate_id)], args=[owner, *args])
        return bool(reply)

    # ---- composite steps: one script, one round trip each ---------------------------------------

    def _all_keys(self, debate_id: str) -> list[str]:
        return [self._result_key(debate_id), self._lease_key(debate_id), *self._keys(debate_id)]

    async def start(self, debate_id: str, owner: str, ttl_s: float, header: bytes) -> Opening:
        reply = await self._batched("start", self._all_keys(debate_id),
                                    [owner, lease_ttl_ms(ttl_s), header])
        if reply[0] == 1:
            return Opening(result=bytes(reply[1]))
        if reply[0] == 2:
            holder = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
            return Opening(lease=Lease(holder, max(int(reply[2]), 0) / 1000))
        flat, entries = reply[1], reply[2]
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        counters = Counters(*(int(fields.get(name, 0)) for name in _COUNTER_FIELDS))
        checkpoint = StoredCheckpoint(bytes(fields[_HEADER]), [bytes(e) for e in entries], counters)
        return Opening(acquired=True, header=checkpoint.header, checkpoint=checkpoint)

    async def append_many(self, debate_id: str, entries: list[bytes], counters: Counters) -> int:
        args: list[bytes | int] = [counters.prompt_tokens, counters.completion_tokens,
                                   counters.total_tokens, counters.calls, *entries]
        count = int(await self._batched("append_many", list(self._keys(debate_id)), args))
        if count < 0:
            raise not_begun(debate_id)
        return count

    async def finish(self, debate_id: str, owner: str, result: bytes) -> None:
        ttl: str | int = "" if self._result_ttl_ms is None else self._result_ttl_ms
        await self._batched("finish", self._all_keys(debate_id), [result, owner, ttl])

    async def get_lease(self, debate_id: str) -> Lease | None:
        key = self._lease_key(debate_id)
        owner, pttl = await self._send(("GET", key), ("PTTL", key))
        if owner is None or pttl == -2:
            return None
        # -1 (no expiry) only happens if someone PERSISTed the key by hand: report it as endless.
        remaining = math.inf if pttl == -1 else pttl / 1000
        return Lease(owner.decode() if isinstance(owner, bytes) else str(owner), remaining)
