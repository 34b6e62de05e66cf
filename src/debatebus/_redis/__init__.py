"""Redis, as every Redis-backed part of debatebus uses it: the transports, the checkpoint store,
the rate and spend limiters and ``debatebus check``'s heartbeat reader.

- clients: ``build_client`` (a redis-py ``Redis``, or ``RedisCluster`` for ``?cluster=true``),
  ``check_client`` / ``url_or_given`` for a caller's own client, ``connect_check``, ``describe``;
- errors: ``transport_error``, ``map_redis_errors``, ``redis_call`` (redis-py errors →
  ``TransportError``/``ConfigError``);
- the batcher: ``make_batcher``, or ``open_batcher`` (started and connect-checked)
  (``Batcher``: a ``CommandBatcher`` on one server, a
  ``ClusterBatcher`` over the cluster's one slot map on a cluster), every command of a loop tick
  in one pipeline per server;
- keys: ``cluster_key`` / ``stream_key_rule`` (a topic's stream key), ``by_slot``,
  ``check_one_slot``;
- scripts: ``Script``, run the one way (``EVALSHA``, ``EVAL`` when the server lacks it).

The modules behind it are private: their names may change.
"""

from __future__ import annotations

from debatebus._redis.batcher import Check, CommandBatcher, NotSentError
from debatebus._redis.clients import (
    RedisClient,
    build_client,
    check_client,
    describe,
    is_cluster,
    url_or_given,
)
from debatebus._redis.connection import Command
from debatebus._redis.errors import map_redis_errors, redis_call, transport_error
from debatebus._redis.keys import by_slot, check_one_slot, cluster_key, stream_key_rule
from debatebus._redis.routing import (
    Batcher,
    ClusterBatcher,
    connect_check,
    make_batcher,
    open_batcher,
)
from debatebus._redis.scripts import Script
from debatebus._redis.urls import cluster_url, seed_names, split_cluster, split_seeds

__all__ = [
    "Batcher",
    "Check",
    "ClusterBatcher",
    "Command",
    "CommandBatcher",
    "NotSentError",
    "RedisClient",
    "Script",
    "build_client",
    "by_slot",
    "check_client",
    "check_one_slot",
    "cluster_key",
    "cluster_url",
    "connect_check",
    "describe",
    "is_cluster",
    "make_batcher",
    "map_redis_errors",
    "open_batcher",
    "redis_call",
    "seed_names",
    "split_cluster",
    "split_seeds",
    "stream_key_rule",
    "transport_error",
    "url_or_given",
]
