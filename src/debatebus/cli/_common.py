"""Pieces shared by the CLI commands: the broker option and argument types with clear errors."""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from typing import Any

from debatebus.exceptions import ConfigError
from debatebus.transports import DEFAULT_BROKER


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


def load_attribute(spec: str, what: str) -> Any:
    """The attribute ``module:attribute`` names (the module imported from the working directory
    too); ConfigError says what was wrong. ``what``: what it should be, for the messages."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{what} must be given as module:attribute, e.g. myapp:app (got {spec!r})")
    sys.path.insert(0, ".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {spec!r}: {exc}") from exc
