"""Redis URLs: the ``cluster`` parameter (``?cluster=true``) and a cluster URL's seeds
(``redis://node1:7000,node2:7000/0?cluster=true``)."""

from __future__ import annotations

from urllib.parse import urlsplit

from debatebus._redaction import redact
from debatebus.exceptions import ConfigError

#: The URL parameter that asks for a Redis Cluster (any scheme: Streams, pub/sub, store, limiter).
_CLUSTER_PARAM = "cluster"
_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def split_cluster(url: str) -> tuple[str, bool]:
    """``url`` without its ``cluster`` parameter (redis-py would hand it to every connection),
    and whether it asks for a Redis Cluster: ``?cluster=true`` (or yes/1/on; false/no/0/off)."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, False
    kept, cluster = [], False
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name != _CLUSTER_PARAM:
            kept.append(part)
        elif value.lower() in _TRUE:
            cluster = True
        elif value.lower() not in _FALSE:
            raise ConfigError(f"invalid Redis URL {redact(url)!r}: cluster= takes true or false,"
                              f" not {value!r}")
    return (f"{base}?{'&'.join(kept)}" if kept else base), cluster


def split_seeds(url: str) -> tuple[str, list[tuple[str, int]]]:
    """``url`` on its first host, and every host it names, in order: a cluster URL may name
    several seeds (``redis://node1:7000,node2:7000/0?cluster=true``), tried in turn."""
    scheme, sep, rest = url.partition("://")
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]  # tail: the db, query and fragment, if any
    auth, at, hosts = netloc.rpartition("@")
    seeds = []
    for seed in hosts.split(",") if hosts else ():
        try:
            parts = urlsplit(f"//{seed}")
            seeds.append((parts.hostname or "localhost", parts.port or 6379))  # redis-py's defaults
        except ValueError as e:  # a port that is not a number
            raise ConfigError(f"invalid Redis URL {redact(url)!r}: seed {seed!r}: {e}") from None
    return f"{scheme}{sep}{auth}{at}{hosts.partition(',')[0]}{tail}", seeds


def seed_names(url: str | None) -> list[str]:
    """``host:port`` of every seed a cluster URL names, in order; none for a URL without
    ``cluster=true`` (or no URL: a caller's own client). What a cluster batcher falls back to when
    no node it knows answers."""
    if url is None:
        return []
    plain, cluster = split_cluster(url)
    return [f"{host}:{port}" for host, port in split_seeds(plain)[1]] if cluster else []


def cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``?cluster=true``)."""
    return split_cluster(url)[1]
