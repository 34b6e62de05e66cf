"""Pieces shared by the CLI commands."""

from __future__ import annotations

import argparse
import os

__all__ = ["DEFAULT_BROKER", "add_broker", "broker_url"]

DEFAULT_BROKER = "redis://localhost:6379/0"


def broker_url(value: str | None) -> str:
    return value or os.environ.get("DEBATEBUS_BROKER") or DEFAULT_BROKER


def add_broker(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker",
        help=f"broker URL (redis://, rediss://, redis+pubsub://, kafka://host:port[,…], memory://); "
        f"default $DEBATEBUS_BROKER or {DEFAULT_BROKER}",
    )
