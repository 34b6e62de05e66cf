"""Shared fixtures for the engine tests: a deterministic model backend and an event recorder.

``Stage`` answers every call from the request alone (``"<speaker> <purpose> <round>"`` unless a
reply is scripted for that call), so a test can recompute the token usage of every call it made
with the fake's own word counts, independently of the engine's accounting.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from debatebus._usage import ZERO_USAGE
from debatebus.exceptions import LLMError
from debatebus.llm import LLMRequest, TokenUsage
from debatebus.llm._fakes import word_usage
from debatebus.schemas import events as ev
from debatebus.testing import FunctionLLM

# (speaker, purpose, round) of one call, e.g. ("alice", "opening", 1) or ("judge", "judge", 2).
Key = tuple[str, str, int]


def key_of(request: LLMRequest) -> Key:
    return (request.speaker, request.purpose, request.round)


class Stage:
    """A FunctionLLM backend whose answers depend only on the request.

    ``consensus_at``: the judge answers ``consensus: true`` from that round on (never when None).
    ``replies`` / ``failures``: a scripted text or exception for particular calls.
    ``delay``: seconds each call sleeps (makes the backend async).
    """

    def __init__(
        self,
        *,
        consensus_at: int | None = None,
        replies: Mapping[Key, str] | None = None,
        failures: Mapping[Key, BaseException] | None = None,
        delay: float = 0.0,
        model: str = "stage",
    ) -> None:
        self.consensus_at = consensus_at
        self.replies = dict(replies or {})
        self.failures = dict(failures or {})
        self.delay = delay
        self.in_flight = 0
        self.max_in_flight = 0
        fn: Callable[[LLMRequest], Any] = self._answer_slowly if delay else self._answer
        self.llm = FunctionLLM(fn, model=model)

    @property
    def requests(self) -> list[LLMRequest]:
        return self.llm.requests

    @property
    def keys(self) -> list[Key]:
        return [key_of(r) for r in self.requests]

    def prompts(self, speaker: str, purpose: str | None = None) -> list[str]:
        return [
            r.prompt
            for r in self.requests
            if r.speaker == speaker and (purpose is None or r.purpose == purpose)
        ]

    def prompt_of(self, speaker: str, purpose: str, round_: int) -> str:
        (prompt,) = [r.prompt for r in self.requests if key_of(r) == (speaker, purpose, round_)]
        return prompt

    def text_for(self, request: LLMRequest) -> str:
        key = key_of(request)
        if key in self.replies:
            return self.replies[key]
        if request.purpose == "judge":
            agreed = self.consensus_at is not None and request.round >= self.consensus_at
            return json.dumps({"consensus": agreed, "summary": f"after round {request.round}"})
        return f"{request.speaker} {request.purpose} {request.round}"

    def _answer(self, request: LLMRequest) -> str:
        failure = self.failures.get(key_of(request))
        if failure is not None:
            raise failure
        return self.text_for(request)

    async def _answer_slowly(self, request: LLMRequest) -> str:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        return self._answer(request)

    def expected_usage(self) -> TokenUsage:
        """The sum over every call this backend received, from the fake's word counts."""
        total = ZERO_USAGE
        for request in self.requests:
            failure = self.failures.get(key_of(request))
            if failure is None:
                total += word_usage(request, self.text_for(request))
            elif isinstance(failure, LLMError) and failure.usage is not None:
                total += failure.usage
        return total


class EventLog:
    """An ``on_event`` callback that keeps every event with the time it arrived."""

    def __init__(self) -> None:
        self.events: list[ev.DebateEvent] = []
        self.times: list[float] = []

    def __call__(self, event: ev.DebateEvent) -> None:
        self.events.append(event)
        self.times.append(time.perf_counter())

    @property
    def types(self) -> list[str]:
        return [tag_of(e) for e in self.events]

    def of(self, event_type: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, event_type)]

    def time_of(self, event_type: type[Any], **match: Any) -> float:
        (moment,) = [
            t
            for e, t in zip(self.events, self.times, strict=True)
            if isinstance(e, event_type) and all(getattr(e, k) == v for k, v in match.items())
        ]
        return moment


def tag_of(event: ev.DebateEvent) -> str:
    return event.kind


@pytest.fixture
def make_stage() -> Callable[..., Stage]:
    return Stage


@pytest.fixture
def events() -> EventLog:
    return EventLog()
