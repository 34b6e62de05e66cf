"""Which topics exist, and creating the missing ones with the admin client before first use,
never left to broker auto-creation (which would pick its own partition count and retention):
each with the transport's partitions, replication factor and ``retention.ms``."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError, for_code

from debatebus.exceptions import TransportError
from debatebus.transports.kafka._errors import kafka_errors
from debatebus.transports.kafka._settings import KafkaSettings

_T = TypeVar("_T")


class Topics:
    """The topics known to exist, listed once and then learnt by creating them. ``admin`` hands
    out the transport's admin client, connecting it on first use."""

    def __init__(self, settings: KafkaSettings,
                 admin: Callable[[], Awaitable[AIOKafkaAdminClient]]) -> None:
        self.settings = settings
        self._admin = admin
        self._lock = asyncio.Lock()
        self._known: set[str] = set()
        self._listed = False

    async def ensure(self, names: Iterable[str]) -> None:
        """Create those of ``names`` that do not exist yet."""
        missing = set(names) - self._known
        if not missing:
            return
        admin = await self._admin()
        async with self._lock:
            if not self._listed:
                # Learn what exists first: creating an existing topic may be refused by ACLs
                # even where reading and writing it is allowed.
                self._known.update(await self._request("listing topics", admin.list_topics))
                self._listed = True
            missing -= self._known
            if missing:
                await self._create(admin, sorted(missing))

    async def recheck(self, names: Iterable[str]) -> None:
        """Forget which topics exist and ensure ``names`` again: a broker that restarted
        without its data (Tansu's ``memory://``) lost every topic, yet takes records for them
        and then drops those records when the topic is created."""
        async with self._lock:
            self.forget()
        await self.ensure(names)

    def forget(self) -> None:
        """Know of no topic: list them again at the next ``ensure``."""
        self._known.clear()
        self._listed = False

    async def exists(self, name: str) -> bool:
        """Whether topic ``name`` exists (listed now, not created)."""
        admin = await self._admin()
        with kafka_errors("listing topics", self.settings.servers):
            self._known.update(await admin.list_topics())
        return name in self._known

    async def _create(self, admin: AIOKafkaAdminClient, names: list[str]) -> None:
        settings = self.settings
        new = [NewTopic(n, settings.partitions, settings.replication_factor,
                        topic_configs=settings.topic_configs) for n in names]
        response = await self._request(f"creating topics {', '.join(names)}",
                                       functools.partial(admin.create_topics, new))
        refused = []
        for entry in response.topic_errors:  # (topic, error_code[, error_message])
            name, code = entry[0], entry[1]
            if code in (0, TopicAlreadyExistsError.errno):
                self._known.add(name)
            else:
                refused.append(f"{name}: {for_code(code).__name__} {entry[2:] or ''}")
        if refused:
            raise TransportError(
                f"Kafka refused to create topics ({'; '.join(refused)}): allow this client to "
                f"create topics, or create them with {settings.partitions} partitions beforehand")

    async def _request(self, action: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """An admin request, sent twice if the connection dropped: the admin client's first
        request after a broker restart fails on the old connection, then it reconnects."""
        for attempt in (1, 2):
            try:
                with kafka_errors(action, self.settings.servers):
                    return await call()
            except TransportError as exc:
                if attempt == 2 or not isinstance(exc.__cause__, KafkaConnectionError):
                    raise
        raise AssertionError("unreachable")
