"""Lua scripts, and the one way debatebus runs them: ``EVALSHA``, pipelined by a batcher with
every other command of the loop tick. A Redis that does not have the script (it restarted, or a
replica that never saw it took over) answers ``NOSCRIPT``: the command did not run, so the
script is loaded (``SCRIPT LOAD``, once for a burst of callers; on every master of a cluster)
and the ``EVALSHA`` sent again."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

from redis import exceptions as redis_errors

from debatebus._redis.connection import Command
from debatebus.exceptions import TransportError


class ScriptRunner(Protocol):
    """What a script runs on: a batcher (one server or a cluster)."""

    async def submit(self, commands: Sequence[Command]) -> list[Any]: ...

    async def load_script(self, text: str) -> None: ...


class Script:
    """A Lua script: its text, and the SHA1 Redis knows it by."""

    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    async def run(self, batcher: ScriptRunner, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """The script's reply for ``keys`` and ``args`` (see the module docstring)."""
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            [reply] = await batcher.submit([command])
        except TransportError as exc:
            if not isinstance(exc.__cause__, redis_errors.NoScriptError):
                raise
            await batcher.load_script(self.text)
            [reply] = await batcher.submit([command])
        return reply
