"""The one interface every model sits behind: ``await llm.complete(request) -> response``, and
``llm.stream(request)``, the same answer as it is written (``LLMStream``)."""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol, Self, runtime_checkable

from pydantic import BaseModel

from debatebus._usage import TokenUsage

Role = Literal["user", "assistant"]


# Not frozen: a frozen dataclass's __init__ costs 4× more, and a debate builds one request per call.
# Treat them as immutable all the same.
@dataclass(slots=True)
class Message:
    """One message. ``breaks``: offsets into ``content``, ascending, where a prefix the debate's
    other calls share ends (the prompt's stable head, each earlier call's transcript, the whole
    transcript so far): a provider that caches prompt prefixes marks its cache there (Anthropic's
    ``cache_control``). Everything after the last break varies from call to call."""

    role: Role
    content: str
    breaks: tuple[int, ...] = ()


@dataclass(slots=True)
class LLMRequest:
    """What a speaker is asked. ``purpose`` and ``speaker`` let fakes and logs tell calls apart.
    ``stop``: strings that end the answer where they would appear (e.g. another speaker's tag);
    a provider that cannot pass them on may ignore them (the engine also cuts turns itself).
    ``cache_key``: the same for every call of one debate (its id), so a provider can route the
    debate's calls to where their shared prefix is cached (OpenAI's ``prompt_cache_key``)."""

    system: str
    messages: tuple[Message, ...]
    response_schema: type[BaseModel] | None = None
    max_tokens: int | None = None
    speaker: str = ""
    purpose: str = ""
    round: int = 0
    stop: tuple[str, ...] = ()
    cache_key: str = ""

    @property
    def prompt(self) -> str:
        """The last user message: the prompt this call is answering."""
        for message in reversed(self.messages):
            if message.role == "user":
                return message.content
        return ""


@dataclass(slots=True)
class LLMResponse:
    text: str
    structured: BaseModel | None = None
    usage: TokenUsage | None = None
    model: str = ""
    raw: Any = field(default=None, repr=False, compare=False)


#: What a stream's source yields: pieces of the answer's text, in order, then its response, last.
Piece = str | LLMResponse


class LLMStream(AsyncIterator[str]):
    """An answer as it is written: ``async for piece in stream`` gives its text in order, and once
    the loop ends ``stream.response`` is the ``LLMResponse`` that ``complete`` would have returned
    (its whole text, usage included). A provider's error is raised from the loop, as ``complete``
    raises it. ``async with stream:`` (or ``aclose()``) ends a stream left early: the provider's
    connection is closed then, not when the garbage collector gets to it.

    Built from ``source``, an async generator yielding the pieces and then the response (exactly
    one ``LLMResponse``, last): that is how providers write it."""

    __slots__ = ("_source", "response")

    def __init__(self, source: AsyncGenerator[Piece, None]) -> None:
        self._source = source
        self.response: LLMResponse | None = None

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> str:
        piece = await self._source.__anext__()
        if isinstance(piece, str):
            return piece
        self.response = piece
        await self._source.aclose()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        await self._source.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


async def streamed_whole(
    answer: Callable[[], Awaitable[LLMResponse]],
) -> AsyncGenerator[Piece, None]:
    """A stream's source for an answer that comes in one piece (``await answer()``): its text
    once (when there is any), then the response. ``LLM.stream``'s default, over ``complete``."""
    response = await answer()
    if response.text:
        yield response.text
    yield response


@runtime_checkable
class LLM(Protocol):
    """Anything with an async ``complete`` and a ``stream``. ``model`` names it in results, logs
    and drift hashes.

    ``stream`` has a default, the answer of ``complete`` in one piece: a class that subclasses
    ``LLM`` gets it (every shipped model does, and the providers override it to stream tokens as
    the server sends them). Its ``interval_s`` says how often the caller takes pieces: a model
    that reads a connection (the providers) reads it at the ticks of ``next_tick`` and hands on
    what arrived meanwhile as one piece, which costs far less CPU than a read per token; 0, as
    they come."""

    @property
    def model(self) -> str: ...

    async def complete(self, request: LLMRequest) -> LLMResponse: ...

    def stream(self, request: LLMRequest, *, interval_s: float = 0.0) -> LLMStream:
        """The answer to ``request`` as it is written (see ``LLMStream``), in pieces at the ticks
        of ``interval_s`` (``next_tick``) where reading costs. By default the text of
        ``complete`` in one piece."""
        return LLMStream(streamed_whole(lambda: self.complete(request)))


def tick(now: float, interval_s: float) -> int:
    """Which tick of a stream paced at ``interval_s`` ``now`` (the event loop's clock) is in:
    ``now`` divided by ``interval_s``, rounded down, up to 2 ms (or a quarter interval) early
    counting as at the tick: uvloop's timers and clock go by the millisecond, so a timer set for
    a tick may fire a little before it, and its read must count as the tick's."""
    return math.floor((now + min(0.002, interval_s / 4)) / interval_s)


def next_tick(now: float, interval_s: float) -> float:
    """When a stream paced at ``interval_s`` next moves after ``now``: the next multiple of
    ``interval_s`` on the loop's clock. Every paced stream keeps the same ticks, the provider
    reading its connection as the turn publishing its text, so that a piece read at a tick is
    published at once, and the turns written at the same time are read and published in the same
    turn of the loop (the bus sends their deltas as one batch)."""
    return (tick(now, interval_s) + 1) * interval_s


def model_name(llm: object) -> str:
    """The model name of any LLM-like object, falling back to its class name."""
    name = getattr(llm, "model", None)
    return name if isinstance(name, str) and name else type(llm).__name__
