"""The live debate page (extra ``web``): ``debatebus web --broker URL``, ``create_app(...)`` for
any ASGI server, or ``build_server(...)`` for uvicorn."""

from __future__ import annotations

from debatebus.web._app import create_app
from debatebus.web._server import build_server

__all__ = ["build_server", "create_app"]
