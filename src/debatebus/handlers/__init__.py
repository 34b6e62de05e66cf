"""Debates as bus handlers: ``DebateHandler`` (made by ``Debate.as_handler``) and what a bus calls
to make it durable by default."""

from debatebus.handlers.handler import (
    DebateHandler,
    attach_default_stores,
    no_default_store_warning,
)

__all__ = ["DebateHandler", "attach_default_stores", "no_default_store_warning"]
