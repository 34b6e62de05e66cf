"""aiokafka failures as ``TransportError``s that say what to check, and shutdown steps that log
their failures instead of raising them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterator
from typing import Any, Final

from aiokafka import ConsumerStoppedError, IllegalOperation
from aiokafka.errors import (
    CommitFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
)

from debatebus.exceptions import TransportError

# The transport's modules share one logger, so operators filter on one name whichever logs.
logger = logging.getLogger("debatebus.transports.kafka")

_KAFKA_ERRORS: Final = (KafkaError, ConsumerStoppedError, IllegalOperation)

_HINTS: Final[tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...]] = (
    (KafkaConnectionError, "check that a broker listens at {servers} and that the address it "
                           "advertises is reachable from this host"),
    (CommitFailedError, "the group rebalanced and the partition moved to another consumer, which "
                        "redelivers from the last commit"),
    ((MessageSizeTooLargeError, RecordTooLargeError),
     "the message exceeds the producer's max_request_size or the topic's max.message.bytes"),
    ((TopicAuthorizationFailedError, GroupAuthorizationFailedError),
     "check this client's ACLs on the broker"),
    ((KafkaTimeoutError, RequestTimedOutError),
     "the broker at {servers} did not answer in time: check it is up and not overloaded"),
)


def _translate(exc: BaseException, action: str, servers: str) -> TransportError:
    hint = next((h for kinds, h in _HINTS if isinstance(exc, kinds)),
                "check the broker at {servers} and its logs")
    error = TransportError(f"Kafka: {action} failed ({type(exc).__name__}: {exc}); "
                           f"{hint.format(servers=servers)}")
    error.__cause__ = exc
    return error


@contextlib.contextmanager
def _kafka_errors(action: str, servers: str) -> Iterator[None]:
    """Callers see ``TransportError`` (saying what to check), never an aiokafka exception."""
    try:
        yield
    except _KAFKA_ERRORS as exc:
        raise _translate(exc, action, servers) from exc


async def _quietly(step: Awaitable[Any], what: str, timeout: float) -> None:
    """Shutdown steps log their failures: a close must not raise over a broker that went away."""
    try:
        async with asyncio.timeout(timeout):
            await step
    except (TimeoutError, *_KAFKA_ERRORS) as exc:
        logger.warning("Kafka: %s failed during close: %r", what, exc)
