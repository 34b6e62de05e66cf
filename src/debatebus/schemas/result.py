"""What a handled request publishes: ``HandlerResult``, the status and the fields of its answer.

It sits with the wire values because everything that settles or watches a request reads it (the
settler, the transports' wire dialects, the observers), below the handlers that build it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["HandlerResult", "Status"]

Status = Literal["completed", "failed"]


@dataclass(frozen=True, slots=True)
class HandlerResult:
    """A handled request: ``completed`` or ``failed``, the fields to publish (the payload merged
    with the ``debate*`` result fields), and whether they were a stored or shared result."""

    status: Status
    fields: dict[str, Any] = field(default_factory=dict)
    replayed: bool = False
