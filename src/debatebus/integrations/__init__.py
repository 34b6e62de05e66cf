"""Hosting debatebus handlers inside other frameworks' apps (``faststream``); docs/embedding.md
shows these and the plain-callable recipe for any other framework."""

__all__: list[str] = []
