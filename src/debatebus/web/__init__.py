"""The live debate page (extra ``web``): ``debatebus web --broker URL`` or ``create_app(...)``."""

from __future__ import annotations

from debatebus.web.app import create_app

__all__ = ["create_app"]
