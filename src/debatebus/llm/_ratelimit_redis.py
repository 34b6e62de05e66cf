"""The fleet's limits in Redis, shared by every worker using the same limit name and prefix:
``RedisRateLimiter`` (one token bucket) and ``RedisSpendLimiter`` (money per time window).

Keys, hash-tagged by the limit's name so that a limit's keys live in one Redis Cluster slot::

    {prefix}:{ratelimit:<name>}:bucket   hash  rq, tk (request and token levels), ts (last refill,
                                               ms of Redis's clock), bu (nobody is granted before)
    {prefix}:{ratelimit:<name>}:holders  zset  concurrency slots: holder → lease expiry (ms)
    {prefix}:{spend:<name>}              hash  w (the current window's number), s (spent in it)

One Lua script per kind of limit makes every change, on Redis's own clock (``TIME``), so workers'
clocks may disagree. The bucket key expires when it would have refilled anyway, the spend key when
its window ends; a slot whose holder died frees itself after ``lease_s``.
"""

from __future__ import annotations

import math
from typing import Any

from debatebus._redis import (
    Batcher,
    RedisClient,
    Script,
    build_client,
    describe,
    make_batcher,
    seed_names,
    url_or_given,
)
from debatebus.llm._ratelimit import (
    CONCURRENCY_POLL_S,
    Permit,
    RateLimit,
    RateLimiter,
    WaitObserver,
)
from debatebus.llm._spend import SpendLimit, SpendLimiter, Window

# ARGV: op, request rate (per ms), request capacity, token rate (per ms), token capacity,
# max_concurrent (0: none), then the op's own arguments. Replies with the ms worth waiting
# (a string, to keep the fraction), "0" when granted or done.
_SCRIPT = Script("""
local bucket, holders = KEYS[1], KEYS[2]
local op = ARGV[1]
local req_rate, req_cap = tonumber(ARGV[2]), tonumber(ARGV[3])
local tok_rate, tok_cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local max_conc = tonumber(ARGV[6])
if op == 'release' then
  redis.call('ZREM', holders, ARGV[7])
  return '0'
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local s = redis.call('HMGET', bucket, 'rq', 'tk', 'ts', 'bu')
local elapsed = math.max(now - (tonumber(s[3]) or now), 0)
local rq = math.min(req_cap, (tonumber(s[1]) or req_cap) + elapsed * req_rate)
local tk = math.min(tok_cap, (tonumber(s[2]) or tok_cap) + elapsed * tok_rate)
local bu = tonumber(s[4]) or 0
local function save()
  local ms = math.max(bu - now, 0)
  if req_rate > 0 then ms = math.max(ms, (req_cap - rq) / req_rate) end
  if tok_rate > 0 then ms = math.max(ms, (tok_cap - tk) / tok_rate) end
  redis.call('HSET', bucket, 'rq', tostring(rq), 'tk', tostring(tk), 'ts', tostring(now),
             'bu', tostring(bu))
  redis.call('PEXPIRE', bucket, math.ceil(ms) + 1000)
end
if op == 'settle' then
  tk = math.min(tok_cap, tk - tonumber(ARGV[7]))
  save()
  return '0'
end
if op == 'penalize' then
  bu = math.max(bu, now + tonumber(ARGV[7]))
  save()
  return '0'
end
local holder, lease = ARGV[7], tonumber(ARGV[8])
local need_req, need_tok = tonumber(ARGV[9]), tonumber(ARGV[10])
local wait = math.max(bu - now, 0)
if req_rate > 0 and rq < math.min(need_req, req_cap) then
  wait = math.max(wait, (math.min(need_req, req_cap) - rq) / req_rate)
end
if tok_rate > 0 and tk < math.min(need_tok, tok_cap) then
  wait = math.max(wait, (math.min(need_tok, tok_cap) - tk) / tok_rate)
end
if max_conc > 0 then
  redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
  if redis.call('ZCARD', holders) >= max_conc then
    wait = math.max(wait, tonumber(ARGV[11]))
  end
end
if wait > 0 then
  return tostring(wait)
end
rq = rq - need_req
tk = tk - need_tok
save()
if max_conc > 0 then
  redis.call('ZADD', holders, now + lease, holder)
  redis.call('PEXPIRE', holders, lease)
end
return '0'
""")
# KEYS[1]: the limit's hash. ARGV: op ("get" or "add"), the window (ms), the amount added. Replies
# with what the current window has spent and the ms until it ends (strings, to keep fractions).
_SPEND_SCRIPT = Script("""
local key, op, window = KEYS[1], ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local index = math.floor(now / window)
local left = (index + 1) * window - now
local s = redis.call('HMGET', key, 'w', 's')
local spent = 0
if tonumber(s[1]) == index then spent = tonumber(s[2]) or 0 end
if op == 'add' then
  spent = spent + tonumber(ARGV[3])
  redis.call('HSET', key, 'w', string.format('%d', index), 's', string.format('%.17g', spent))
  redis.call('PEXPIRE', key, math.ceil(left) + 1000)
end
return {string.format('%.17g', spent), string.format('%.17g', left)}
""")


class _Scripts:
    """One limit's script calls on Redis (a URL, or a client the caller keeps owning), each
    pipelined with every other of this loop tick and bounded by ``timeout_s``; Redis errors raise
    ``TransportError``."""

    def __init__(self, url_or_client: str | RedisClient, script: Script, *,
                 connect_timeout: float, timeout_s: float) -> None:
        self._url, self._given = url_or_given(url_or_client)
        self._where = describe(self._url, self._given)
        self._script = script
        self._connect_timeout = connect_timeout
        self._timeout_s = timeout_s
        self._client: RedisClient | None = None
        self._batch: Batcher | None = None

    def _batcher(self) -> Batcher:
        if self._batch is None:
            self._client = self._given or build_client(
                self._url or "", connect_timeout=self._connect_timeout)
            self._batch = make_batcher(self._client, self._where, timeout=self._timeout_s,
                                       seeds=seed_names(self._url))
            self._batch.start()
        return self._batch

    async def run(self, keys: tuple[str, ...], *args: float | int | str) -> Any:
        """The script's reply for ``keys`` and ``args`` (a burst of calls ending at once settles
        in a round trip or two, over one connection)."""
        return await self._script.run(self._batcher(), keys, args)

    async def close(self) -> None:
        batch, self._batch = self._batch, None
        if batch is not None:
            await batch.stop()
        client, self._client = self._client, None
        if client is not None and self._given is None:
            await client.aclose()


class RedisRateLimiter(RateLimiter):
    """A limit shared through Redis (a URL, or a ``redis.asyncio.Redis`` built with
    ``decode_responses=False`` that the caller keeps owning) by every limiter with the same
    ``prefix`` and ``name``. Each call is bounded by ``timeout_s``; Redis errors raise
    ``TransportError``.

    ``lease_s`` bounds how long a ``max_concurrent`` slot outlives a worker that died holding it
    (keep it above the longest model call). A wait cancelled while its ask is in flight may leave
    its budget taken and its slot held until the lease ends."""

    def __init__(self, url_or_client: str | RedisClient, name: str, limit: RateLimit, *,
                 prefix: str = "debatebus", on_wait: WaitObserver | None = None,
                 lease_s: float = 300.0, connect_timeout: float = 5.0,
                 timeout_s: float = 5.0) -> None:
        super().__init__(name, limit, on_wait=on_wait)
        self._scripts = _Scripts(url_or_client, _SCRIPT, connect_timeout=connect_timeout,
                                 timeout_s=timeout_s)
        self.timeout_s = timeout_s
        self._lease_ms = max(math.ceil(lease_s * 1000), 1)
        tag = f"{prefix}:{{ratelimit:{name}}}"
        self.keys = (f"{tag}:bucket", f"{tag}:holders")
        self._config = (
            limit.rate(limit.requests_per_minute) / 1000.0,
            limit.capacity(limit.requests_per_minute),
            limit.rate(limit.tokens_per_minute) / 1000.0,
            limit.capacity(limit.tokens_per_minute),
            limit.max_concurrent or 0,
        )

    async def _run(self, op: str, *args: float | int | str) -> float:
        """One script call: milliseconds worth waiting (0 when done) → seconds."""
        return float(await self._scripts.run(self.keys, op, *self._config, *args)) / 1000.0

    async def _try_acquire(self, permit: Permit, requests: int) -> float:
        return await self._run("acquire", permit.holder, self._lease_ms, requests, permit.tokens,
                               CONCURRENCY_POLL_S * 1000.0)

    async def _adjust_tokens(self, delta: int) -> None:
        await self._run("settle", delta)

    async def _release(self, permit: Permit) -> None:
        await self._run("release", permit.holder)

    async def penalize(self, seconds: float) -> None:
        await self._run("penalize", max(seconds, 0.0) * 1000.0)

    async def close(self) -> None:
        await self._scripts.close()


class RedisSpendLimiter(SpendLimiter):
    """A spend limit shared through Redis (a URL, or a client the caller keeps owning) by every
    limiter with the same ``prefix`` and ``name``: use the Redis and prefix of the fleet's rate
    limits. Each call is bounded by ``timeout_s``; Redis errors raise ``TransportError``."""

    def __init__(self, url_or_client: str | RedisClient, name: str, limit: SpendLimit, *,
                 prefix: str = "debatebus", connect_timeout: float = 5.0,
                 timeout_s: float = 5.0) -> None:
        super().__init__(name, limit)
        self._scripts = _Scripts(url_or_client, _SPEND_SCRIPT, connect_timeout=connect_timeout,
                                 timeout_s=timeout_s)
        self.timeout_s = timeout_s
        self.key = f"{prefix}:{{spend:{name}}}"
        self._window_ms = limit.window_s * 1000.0

    async def _run(self, op: str, amount: float = 0.0) -> Window:
        spent, left_ms = await self._scripts.run((self.key,), op, self._window_ms, amount)
        return Window(float(spent), float(left_ms) / 1000.0)

    async def window(self) -> Window:
        return await self._run("get")

    async def _add(self, cost: float) -> None:
        await self._run("add", cost)

    async def close(self) -> None:
        await self._scripts.close()
