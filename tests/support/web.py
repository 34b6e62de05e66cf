"""An ASGI app served by uvicorn in the test's event loop, and the live page's test token."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

from tests.support.servers import free_port

TIMEOUT = 60.0
TOKEN = "live-page-token-0123456789"


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """``app`` on uvicorn on a free port, in this event loop."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=2))
    async with started(server):
        yield f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def started(server: uvicorn.Server) -> AsyncIterator[None]:
    """``server`` serving in this event loop until the block ends."""
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(TIMEOUT):
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
                raise AssertionError("uvicorn exited before it started")
            await asyncio.sleep(0.05)
    try:
        yield
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, TIMEOUT)
