"""Hosting debatebus handlers inside other frameworks' apps (``faststream``); docs/embedding.md
shows these and the plain-callable recipe for any other framework."""
from debatebus._settler import Flow, Outlet

__all__ = [
    "Flow",
    "Outlet",
]
