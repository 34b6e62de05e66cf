"""Calling debates from Python over the bus: publish a request and wait for its result."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any, Self

from debatebus.exceptions import TransportError
from debatebus.observability.tracing import inject_traceparent
from debatebus.schemas.envelope import (
    ENVELOPE_DECODER,
    ENVELOPE_ENCODER,
    Envelope,
    completed_topic,
    failed_topic,
    new_message_id,
    now_iso,
)
from debatebus.transports import Delivery, Outgoing, Transport, broker_url, transport_from_url

__all__ = ["BusClient", "request_message"]


class BusClient:
    """``async with BusClient(url) as c: result = await c.request("debate:request", {"input": …})``.

    Without ``broker``: ``$DEBATEBUS_BROKER``, else ``redis://localhost:6379/0`` (``broker_url``)."""

    def __init__(self, broker: str | Transport | None = None, **transport_options: Any) -> None:
        self.transport = (
            broker if isinstance(broker, Transport)
            else transport_from_url(broker_url(broker), **transport_options)
        )

    async def __aenter__(self) -> Self:
        await self.transport.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.transport.close()

    async def publish(self, event_type: str, payload: Mapping[str, Any], *,
                      request_id: str | None = None, correlation_id: str | None = None,
                      headers: Mapping[str, str] | None = None) -> str:
        message = request_message(event_type, payload, request_id=request_id,
                                  correlation_id=correlation_id, headers=headers)
        await self.transport.publish(message)
        return str(message.key)

    async def results(self, event_type: str) -> AsyncIterator[Envelope]:
        """Every result (completed or failed) of ``event_type`` published after this returns."""
        topics = [completed_topic(event_type), failed_topic(event_type)]
        return _decoded(await self.transport.subscribe(topics))

    async def request(self, event_type: str, payload: Mapping[str, Any], *,
                      request_id: str | None = None, timeout: float = 300.0,
                      correlation_id: str | None = None,
                      headers: Mapping[str, str] | None = None) -> Envelope:
        """Publish a request and return its result envelope (``payload["debateStatus"]``)."""
        rid = request_id or uuid.uuid4().hex
        topics = [completed_topic(event_type), failed_topic(event_type)]
        subscription = await self.transport.subscribe(topics)  # listening before we publish
        await self.publish(event_type, payload, request_id=rid, correlation_id=correlation_id,
                           headers=headers)
        try:
            async with asyncio.timeout(timeout):
                async for delivery in subscription:
                    envelope = _decode(delivery)
                    if envelope is not None and envelope.request_id == rid:
                        return envelope
        except TimeoutError:
            raise TransportError(
                f"no result for request {rid} on {topics[0]} within {timeout} s: is a worker "
                f"subscribed to {event_type!r} on this broker?"
            ) from None
        finally:
            await subscription.aclose()  # type: ignore[attr-defined]
        raise TransportError(f"the subscription to {topics} ended before request {rid} was answered")


def request_message(event_type: str, payload: Mapping[str, Any], *, request_id: str | None = None,
                    correlation_id: str | None = None,
                    headers: Mapping[str, str] | None = None) -> Outgoing:
    """A request envelope with a fresh ``messageId``, ready to publish, carrying the current trace
    context when there is one."""
    rid = request_id or uuid.uuid4().hex
    body = ENVELOPE_ENCODER.encode(Envelope(
        request_id=rid, payload=dict(payload), message_id=new_message_id(), type=event_type,
        correlation_id=correlation_id, timestamp=now_iso(), headers=inject_traceparent(headers)))
    return Outgoing(event_type, body, key=rid)


async def _decoded(deliveries: AsyncIterator[Delivery]) -> AsyncIterator[Envelope]:
    async for delivery in deliveries:
        envelope = _decode(delivery)
        if envelope is not None:
            yield envelope


def _decode(delivery: Delivery) -> Envelope | None:
    try:
        return ENVELOPE_DECODER.decode(delivery.body)
    except Exception:  # someone else's message on a result topic: not ours to judge
        return None
