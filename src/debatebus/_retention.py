"""How long debatebus keeps what it writes, one rule for all of it: a checkpoint store's checkpoints
and results (``debatebus.checkpoints``) and the broker's topics (a Redis stream's entries, a Kafka
topic's records: ``topic_retention_s``). Seven days unless told otherwise; ``math.inf`` keeps
everything. In a URL a retention is written ``3600``, ``90s``, ``30m``, ``12h``, ``7d`` or
``never``.
"""

from __future__ import annotations

import math
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit

from debatebus._durations import duration_s
from debatebus.exceptions import ConfigError

#: How long checkpoints, results and topic entries are kept (seconds): 7 days.
DEFAULT_RETENTION_S: Final = 7 * 24 * 3600.0
#: The broker URL's query parameter that sets ``topic_retention_s`` (``redis://…?topic_retention=2d``);
#: every Redis client built from a bus URL leaves it out.
TOPIC_RETENTION_PARAM: Final = "topic_retention"

def retention_ms(retention_s: float, *, name: str = "retention_s") -> int | None:
    """A retention in whole milliseconds (Redis PX granularity); None for ``math.inf`` (keep
    forever). ``ConfigError`` (naming the setting ``name``) for anything but a positive number of
    seconds."""
    if not retention_s > 0:  # also rejects NaN
        raise ConfigError(f"{name} must be a positive number of seconds (math.inf: keep "
                          f"forever), got {retention_s!r}")
    return None if math.isinf(retention_s) else max(1, round(retention_s * 1000))


def parse_retention(text: str, *, param: str = "retention") -> float:
    """A retention from a URL's query parameter ``param``: seconds (``3600``), a number and a unit
    (``90s``, ``30m``, ``12h``, ``7d``), or ``never`` (``math.inf``)."""
    if text.strip().lower() == "never":
        return math.inf
    seconds = duration_s(text)
    if seconds is None:
        raise ConfigError(f"{param}={text!r} in a URL: use seconds or a number with a unit "
                          "(90s, 30m, 12h, 7d), or never")
    return seconds


def take_retention(url: str, param: str) -> tuple[str, float | None]:
    """``url`` without its query parameter ``param`` (a Redis client would refuse it), and the
    retention it gives (its last value; None when absent)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    values = [value for name, value in query if name == param]
    if not values:
        return url, None
    rest = urlencode([(name, value) for name, value in query if name != param])
    # Rebuilt by hand: urlunsplit would turn sqlite:///abs into sqlite:/abs.
    fragment = f"#{parts.fragment}" if parts.fragment else ""
    return (url.split("?", 1)[0] + (f"?{rest}" if rest else "") + fragment,
            parse_retention(values[-1], param=param))
