"""Supervising a long-lived background task, so that no exception ends it unseen.

A background loop handles the failures it expects (a broker outage: ``TransportError``, a
retriable Kafka error) itself. Anything else used to end its task silently, and whatever waited
on the loop waited forever: a worker that stopped consuming, leases no longer renewed, clients
waiting out their timeouts. ``supervise`` runs such a loop: what it raises is logged with its
traceback, then the loop runs again after a backoff, or, when it keeps failing (or cannot be run
again), whatever waits on it is woken with an error saying what stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from debatebus._backoff import Backoff
from debatebus._redaction import redact

#: How many times in a row a failing loop is run again before it is given up.
RESTARTS: Final = 5
#: A run of the loop that lasted this long before failing starts the count of failures over.
HEALTHY_AFTER_S: Final = 30.0


async def supervise(what: str, run: Callable[[], Awaitable[None]], *, log: logging.Logger,
                    died: Callable[[Exception], None] | None = None,
                    backoff: Backoff | None = None,
                    restarts: int = RESTARTS) -> None:
    """Await ``run()`` until it returns or is cancelled. When it raises, log the error (ERROR,
    with its traceback, naming ``what``: "the Kafka fetch loop of group 'g'"). With a
    ``backoff``, await ``run()`` again after ``backoff.next()`` seconds, up to ``restarts``
    times in a row; without one, or once they are spent, call ``died(error)``, which wakes what
    waits on the loop with an error of its own (None: nothing waits on it), and return."""
    loop = asyncio.get_running_loop()
    failures = 0
    while True:
        started = loop.time()
        try:
            await run()
        except Exception as exc:
            if loop.time() - started >= HEALTHY_AFTER_S:
                failures = 0
                if backoff is not None:
                    backoff.reset()
            failures += 1
            if backoff is None or failures > restarts:
                log.error("%s stopped%s: %s", what, _after(failures),
                          redact(repr(exc)), exc_info=exc)
                if died is not None:
                    died(exc)
                return
            log.error("%s failed (running it again, %d of %d): %s", what, failures, restarts,
                      redact(repr(exc)), exc_info=exc)
        else:
            return
        await asyncio.sleep(backoff.next())


def _after(failures: int) -> str:
    return f" after failing {failures} times in a row" if failures > 1 else ""
