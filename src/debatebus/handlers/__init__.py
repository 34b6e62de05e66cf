"""Debates as bus handlers: the handler contract (``contract``), ``DebateHandler`` (made by
``Debate.as_handler``) and what a bus calls to make it durable by default."""

from debatebus.handlers._children import BusChildren
from debatebus.handlers._contract import (
    BusHandler,
    Handler,
    HandlerContext,
    PlainHandler,
)
from debatebus.handlers._forks import changed, fork
from debatebus.handlers._handler import (
    DebateHandler,
    HandlerOptions,
    attach_default_stores,
    no_default_store_warning,
)
from debatebus.handlers._people import turn_reply
from debatebus.schemas.result import HandlerResult

__all__ = [
    "BusChildren",
    "BusHandler",
    "DebateHandler",
    "Handler",
    "HandlerContext",
    "HandlerOptions",
    "HandlerResult",
    "PlainHandler",
    "attach_default_stores",
    "changed",
    "fork",
    "no_default_store_warning",
    "turn_reply",
]
