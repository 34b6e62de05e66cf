"""The topic → stream key rule, and the hash slots keys live in.

A script or transaction may only touch keys of one hash slot, and the settle script
touches a request stream and its result (or dead-letter) streams together. So on a cluster a
topic's stream key carries its *family* as hash tag (``cluster_key``): the topic with every
``event:…:completed`` / ``event:…:failed`` wrapper and ``:dlq`` suffix peeled off.

* ``debate:request`` → ``{debate:request}``;
* ``event:debate:request:completed`` → ``event:{debate:request}:completed``;
* ``debate:request:dlq`` → ``{debate:request}:dlq``;
* ``event:debate:request:completed:dlq`` → ``event:{debate:request}:completed:dlq``;
* a topic with a non-empty ``{…}`` of its own (``orders:{eu}:new``) is kept as is.

A chained consumer reading ``event:debate:request:completed`` as its request stream settles into
``event:event:debate:request:completed:completed``: the same family, the same slot. Single-node
Redis keeps the topic as the key (no braces).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

from redis.crc import key_slot

from debatebus._redis.connection import Command
from debatebus.exceptions import ConfigError

T = TypeVar("T")
_RESULTS = (":completed", ":failed")


@functools.lru_cache(maxsize=4096)
def cluster_key(topic: str) -> str:
    """The stream key of ``topic`` on a Redis Cluster (see the module docstring)."""
    opening = topic.find("{")
    if opening >= 0 and topic.find("}", opening + 1) > opening + 1:  # Redis's rule: the first
        return topic                                                  # '{', the next '}', not empty
    start, end = 0, len(topic)
    while True:
        if topic.endswith(":dlq", start, end) and end - 4 > start:
            end -= 4
            continue
        suffix = next((s for s in _RESULTS if topic.endswith(s, start, end)), None)
        if (suffix is not None and topic.startswith("event:", start, end)
                and end - len(suffix) > start + 6):
            start, end = start + 6, end - len(suffix)
            continue
        return f"{topic[:start]}{{{topic[start:end]}}}{topic[end:]}"


def _as_is(topic: str) -> str:
    return topic


def stream_key_rule(cluster: bool) -> Callable[[str], str]:
    """The topic → stream key rule: ``cluster_key`` on a cluster, the topic itself otherwise."""
    return cluster_key if cluster else _as_is


def check_one_slot(keys: Sequence[str], what: str) -> None:
    """A ``ConfigError`` unless ``keys`` share one hash slot, as one script's keys must: Redis
    would refuse the script (``CROSSSLOT``) however often it is retried."""
    slots = {key_slot(key.encode()) for key in keys}
    if len(slots) > 1:
        raise ConfigError(f"on a Redis Cluster, {what} must stay in one family (one hash slot), "
                          f"but {', '.join(keys)} are in {len(slots)}: see debatebus._redis.cluster_key")


def by_slot(items: Sequence[T], key: Callable[[T], str]) -> list[list[T]]:
    """``items`` by the hash slot of their key, in first-seen order: what one multi-key command
    (XREADGROUP, XREAD) may name together on a cluster."""
    slots: dict[int, list[T]] = {}
    for item in items:
        slots.setdefault(key_slot(key(item).encode()), []).append(item)
    return list(slots.values())


def command_slot(command: Command) -> int:
    """The slot a command is routed by: a script's first key, else its first argument."""
    name = command[0]
    if name in ("EVALSHA", "EVAL", "evalsha", "eval"):
        key = command[3] if int(command[2]) > 0 else b""
    else:
        key = command[1]
    return key_slot(key.encode() if isinstance(key, str) else bytes(key))
