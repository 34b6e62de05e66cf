"""Auto-pipelining of Lua script calls: every call made in the same event-loop tick, by any
number of concurrent debates, goes to Redis in one pipelined round trip.

redis-py sends each command on its own; with many debates committing rounds at once, the
per-call syscall and connection-pool overhead dominates the cost of checkpointing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

__all__ = ["AutoPipeline"]

_Call = tuple[AsyncScript, Sequence[Any], Sequence[Any], "asyncio.Future[Any]"]


class AutoPipeline:
    def __init__(self, client: Redis) -> None:
        self.client = client
        self._pending: list[_Call] = []
        self._flushing: asyncio.Task[None] | None = None

    async def call(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((script, keys, args, future))
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let the other debates of this tick queue their calls
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                replies = await self._execute(batch)
            except Exception as exc:  # the caller maps it: give every waiter the same error
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (*_, future), reply in zip(batch, replies, strict=True):
                if future.done():
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)

    async def _execute(self, batch: list[_Call]) -> list[Any]:
        replies = await self._send(batch)
        if any(isinstance(r, NoScriptError) for r in replies):  # Redis restarted: scripts are gone
            for script in {id(c[0]): c[0] for c in batch}.values():
                await self.client.script_load(script.script)
            replies = await self._send(batch)
        return replies

    async def _send(self, batch: list[_Call]) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            for script, keys, args, _ in batch:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            result: list[Any] = await pipe.execute(raise_on_error=False)
            return result
