"""The one interface every model sits behind: ``await llm.complete(request) -> response``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel

from debatebus.usage import TokenUsage

__all__ = ["LLM", "LLMRequest", "LLMResponse", "Message", "model_name"]

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


@runtime_checkable
class LLM(Protocol):
    """Anything with an async ``complete``. ``model`` names it in results, logs and drift hashes."""

    @property
    def model(self) -> str: ...

    async def complete(self, request: LLMRequest) -> LLMResponse: ...


def model_name(llm: object) -> str:
    """The model name of any LLM-like object, falling back to its class name."""
    name = getattr(llm, "model", None)
    return name if isinstance(name, str) and name else type(llm).__name__
