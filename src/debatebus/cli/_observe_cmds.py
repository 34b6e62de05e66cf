"""``debatebus check``: exit 0 when a worker of the group (or the one worker named with
``--consumer``) sent a fresh heartbeat, 1 otherwise, with one line saying why (for container
healthchecks, like arq's ``--check``)."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from debatebus._redaction import redact
from debatebus._worker import CONSUMER_ENV, DEFAULT_GROUP
from debatebus.cli._common import add_broker, seconds
from debatebus.exceptions import DebatebusError
from debatebus.observability._heartbeat import latest_heartbeat
from debatebus.transports import broker_url

#: The worker's default interval, for heartbeats that do not say theirs.
_DEFAULT_INTERVAL_S = 5.0


def add_parser(sub: Any) -> None:
    check_parser = sub.add_parser(
        "check", help="exit 0 if a worker of the group (or the one named) sent a fresh heartbeat, "
                      "1 otherwise")
    add_broker(check_parser)
    check_parser.add_argument("--group", default=DEFAULT_GROUP,
                              help=f"the workers' consumer group (default {DEFAULT_GROUP})")
    check_parser.add_argument("--consumer", metavar="NAME",
                              help="check this one worker (its consumer name: `debatebus worker "
                                   f"--consumer`) instead of the group's newest heartbeat "
                                   f"(default ${CONSUMER_ENV} when set)")
    check_parser.add_argument("--max-age", type=seconds, metavar="S",
                              help="oldest acceptable heartbeat in seconds "
                                   "(default 3× the worker's heartbeat interval)")
    check_parser.add_argument("--timeout", type=seconds, default=5.0, metavar="S",
                              help="answer within this many seconds, giving up on the broker "
                                   "(default 5)")
    check_parser.set_defaults(func=_check)


async def _check(args: argparse.Namespace) -> int:
    # --consumer '' checks the group even where $DEBATEBUS_CONSUMER names this container's worker.
    consumer = (args.consumer if args.consumer is not None else os.environ.get(CONSUMER_ENV)) or None
    code, line = await check(broker_url(args.broker), args.group, args.max_age,
                             consumer=consumer, timeout=args.timeout)
    print(redact(line), flush=True)  # heartbeat fields and broker errors may quote the URL
    return code


async def check(url: str, group: str, max_age: float | None = None, *,
                consumer: str | None = None, timeout: float = 5.0) -> tuple[int, str]:
    """(exit code, the line saying why) for the newest heartbeat of ``group`` at ``url`` (of its
    ``consumer`` only, when given), found within ``timeout`` seconds."""
    where = redact(url)  # never print a password from the URL
    try:
        beat = await latest_heartbeat(url, group, consumer, timeout=timeout)
    except TimeoutError:
        return 1, f"unhealthy: the broker at {where} did not answer within {timeout:g} s"
    except DebatebusError as exc:
        return 1, f"unhealthy: {exc}"
    return judge(beat, group, where, max_age, now=time.time(), consumer=consumer)


def judge(beat: dict[str, Any] | None, group: str, where: str, max_age: float | None,
          *, now: float, consumer: str | None = None) -> tuple[int, str]:
    """The verdict on one heartbeat (None: there is none) at time ``now``; ``consumer``: the one
    worker asked about, if any."""
    if beat is None:
        if consumer is not None:
            return 1, (f"unhealthy: no live heartbeat from consumer {consumer!r} of group "
                       f"{group!r} on {where}: it stopped, or never ran under that name")
        return 1, (f"unhealthy: no heartbeat from group {group!r} on {where}: is a worker of "
                   "that group running there?")
    interval = float(beat.get("intervalS") or _DEFAULT_INTERVAL_S)
    limit = max_age if max_age is not None else 3 * interval
    age = max(0.0, now - float(beat["timestamp"]))  # a clock ahead of ours is not staleness
    who = f"{beat.get('consumer')} (pid {beat.get('pid')} on {beat.get('host')})"
    if age > limit:
        whose = f"consumer {consumer!r} in group {group!r}" if consumer else f"group {group!r}"
        return 1, (f"unhealthy: the newest heartbeat of {whose} is {age:.1f} s old "
                   f"(limit {limit:g} s), from {who}")
    if beat.get("connected") is False:
        return 1, (f"unhealthy: {who} in group {group!r} is disconnected from the broker "
                   "(it keeps retrying; see its log)")
    return 0, (f"ok: {who} in group {group!r} beat {age:.1f} s ago, "
               f"{beat.get('inFlight', 0)} debates in flight")
