"""Token accounting value shared by the LLM layer, the engine and the wire."""

from __future__ import annotations

import msgspec

__all__ = ["ZERO_USAGE", "TokenUsage"]


class TokenUsage(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """Tokens spent by one call or summed over many. Encoded as ``{promptTokens, …}`` on the wire."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.total_tokens + other.total_tokens,
        )

    def __sub__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.prompt_tokens - other.prompt_tokens,
            self.completion_tokens - other.completion_tokens,
            self.total_tokens - other.total_tokens,
        )

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> TokenUsage:
        return cls(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)


ZERO_USAGE = TokenUsage()
