"""Pieces shared by the CLI commands: the broker option and argument types with clear errors."""

from __future__ import annotations

import argparse
import math
import os

__all__ = ["DEFAULT_BROKER", "add_broker", "broker_url", "port", "positive_int", "seconds"]

DEFAULT_BROKER = "redis://localhost:6379/0"


def broker_url(value: str | None) -> str:
    return value or os.environ.get("DEBATEBUS_BROKER") or DEFAULT_BROKER


def add_broker(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker",
        help=f"broker URL (redis://, rediss://, redis+pubsub://, kafka://host:port[,…], memory://); "
        f"default $DEBATEBUS_BROKER or {DEFAULT_BROKER}",
    )


def _whole(value: str) -> int | None:
    try:
        return int(value.strip())
    except ValueError:
        return None


def positive_int(value: str) -> int:
    """An argparse type: a whole number ≥ 1."""
    number = _whole(value)
    if number is None or number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 1, not {value!r}")
    return number


def port(value: str) -> int:
    """An argparse type: a TCP port, 1 to 65535."""
    number = _whole(value)
    if number is None or not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, not {value!r}")
    return number


def seconds(value: str) -> float:
    """An argparse type: a finite number of seconds > 0."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, not {value!r}")
    return number
