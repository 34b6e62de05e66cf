"""aiokafka failures as ``TransportError``s that say what to check (``MessageTooLargeError`` for
records too large), shutdown steps that log their failures instead of raising them, and
``QuietOutage``, which keeps aiokafka's retries from repeating the same error while a broker is
down."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Iterable, Iterator
from typing import Any, Final

from aiokafka import ConsumerStoppedError, IllegalOperation
from aiokafka.errors import (
    CommitFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
    UnknownError,
    UnknownTopicOrPartitionError,
)

from debatebus.exceptions import MessageTooLargeError, TransportError

# The transport's modules share one logger, so operators filter on one name whichever logs.
logger = logging.getLogger("debatebus.transports.kafka")

KAFKA_ERRORS: Final = (KafkaError, ConsumerStoppedError, IllegalOperation)

_HINTS: Final[tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...]] = (
    (KafkaConnectionError, "check that a broker listens at {servers} and that the address it "
                           "advertises is reachable from this host"),
    (CommitFailedError, "the group rebalanced and the partition moved to another consumer, which "
                        "redelivers from the last commit"),
    (RecordTooLargeError,
     "a record exceeds the consumer's max_partition_fetch_bytes or the broker's limit"),
    ((TopicAuthorizationFailedError, GroupAuthorizationFailedError),
     "check this client's ACLs on the broker"),
    ((KafkaTimeoutError, RequestTimedOutError),
     "the broker at {servers} did not answer in time: check it is up and not overloaded"),
)


def translate(exc: BaseException, action: str, servers: str) -> TransportError:
    hint = next((h for kinds, h in _HINTS if isinstance(exc, kinds)),
                "check the broker at {servers} and its logs")
    error = TransportError(f"Kafka: {action} failed ({type(exc).__name__}: {exc}); "
                           f"{hint.format(servers=servers)}")
    error.__cause__ = exc
    return error


@contextlib.contextmanager
def kafka_errors(action: str, servers: str) -> Iterator[None]:
    """Callers see ``TransportError`` (saying what to check), never an aiokafka exception."""
    try:
        yield
    except KAFKA_ERRORS as exc:
        raise translate(exc, action, servers) from exc


@contextlib.contextmanager
def producing(topics: Iterable[str], servers: str, *, size: int, limit: int) -> Iterator[None]:
    """``kafka_errors`` for producing records of up to ``size`` bytes: a refusal as too large
    (aiokafka's own check against max_request_size, or the broker's MESSAGE_TOO_LARGE /
    RECORD_LIST_TOO_LARGE) becomes ``MessageTooLargeError``."""
    try:
        yield
    except (MessageSizeTooLargeError, RecordListTooLargeError) as exc:
        raise too_large(topics, size, limit, by_broker=size <= limit) from exc
    except KAFKA_ERRORS as exc:
        raise translate(exc, f"producing to {', '.join(sorted(topics))}", servers) from exc


def too_large(topics: Iterable[str], size: int, limit: int, *, by_broker: bool) -> MessageTooLargeError:
    if by_broker:
        why = (f"the broker refused it: its message.max.bytes (or the topic's max.message.bytes)"
               f" is below this producer's max_request_size of {limit} bytes")
    else:
        why = f"the limit is {limit} bytes (the transport's max_request_size)"
    return MessageTooLargeError(f"Kafka: a {size}-byte record for {', '.join(sorted(topics))} is "
                                f"too large: {why}",
                                size=size, limit=limit)


#: The aiokafka loggers that report a broker it cannot reach (each of its modules has its own, and
#: a filter on a logger sees only that logger's records).
_AIOKAFKA_LOGGERS: Final = (
    "aiokafka", "aiokafka.conn", "aiokafka.cluster", "aiokafka.admin.client",
    "aiokafka.consumer.consumer", "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator", "aiokafka.producer.producer",
    "aiokafka.producer.sender",
)


class _FirstOfEachKind(logging.Filter):
    """Lets the first WARNING-or-worse record of each kind (logger and message template) through;
    its repeats are dropped, or lowered to DEBUG when their logger is enabled for DEBUG."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, object]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        kind = (record.name, record.msg)
        if kind not in self._seen:
            self._seen.add(kind)
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


class _Shared:
    """The one filter on the aiokafka loggers (they are the process's), and how many hold it."""

    holders = 0
    repeats: _FirstOfEachKind | None = None


class QuietOutage:
    """One transport's hold on quiet aiokafka logs: while the broker cannot be reached, aiokafka
    retries on its own and logs each failed try (about one ERROR a second per client, hundreds a
    minute once a member lost its broker) beside the worker's one outage warning.

    ``hold`` when an attempt that may fail starts (a connect) or when one failed (a produce);
    ``release`` once the broker answered, and at close. While any transport holds it, the first
    WARNING-or-worse record of each kind on the aiokafka loggers is logged and its repeats are
    not (they stay at DEBUG for a logger set to DEBUG). Public logging API only: a filter on each
    aiokafka logger, removed when the last hold is released. A hold is released too when its
    ``owner`` is collected (a transport dropped after a failed connect, never closed)."""

    def __init__(self, owner: object) -> None:
        self._holding = False
        weakref.finalize(owner, self.release)

    def hold(self) -> None:
        if self._holding:
            return
        self._holding = True
        if _Shared.holders == 0:
            _Shared.repeats = _FirstOfEachKind()
            for name in _AIOKAFKA_LOGGERS:
                logging.getLogger(name).addFilter(_Shared.repeats)
        _Shared.holders += 1

    def release(self) -> None:
        if not self._holding:
            return
        self._holding = False
        _Shared.holders -= 1
        if _Shared.holders == 0 and _Shared.repeats is not None:
            for name in _AIOKAFKA_LOGGERS:
                logging.getLogger(name).removeFilter(_Shared.repeats)
            _Shared.repeats = None


def lost_topic(exc: TransportError) -> bool:
    """Whether producing failed because the broker does not know the topic (any more). Tansu
    answers UNKNOWN (-1) to the first record for a topic re-created after it restarted."""
    return isinstance(exc.__cause__, (UnknownTopicOrPartitionError, UnknownError))


async def quietly(step: Awaitable[Any], what: str, timeout: float) -> None:
    """Shutdown steps log their failures: a close must not raise over a broker that went away."""
    try:
        async with asyncio.timeout(timeout):
            await step
    except (TimeoutError, *KAFKA_ERRORS) as exc:
        logger.warning("Kafka: %s failed during close: %r", what, exc)
