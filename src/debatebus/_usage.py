"""Token accounting: the value the LLM layer, the engine, the errors and the wire share."""

from __future__ import annotations

import msgspec


class TokenUsage(msgspec.Struct, frozen=True, rename="camel", gc=False):
    """Tokens spent by one call or summed over many. Encoded as ``{promptTokens, …}`` on the wire.

    ``prompt_tokens`` counts every input token, cached or not (what the prompt carried);
    ``cache_read_tokens`` of them were read from the provider's prompt cache (billed at its
    cached-input price) and ``cache_write_tokens`` written to it (Anthropic bills these above the
    input price; OpenAI writes none). Both are 0 where a provider reports no caching."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.total_tokens + other.total_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )

    def __sub__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.prompt_tokens - other.prompt_tokens,
            self.completion_tokens - other.completion_tokens,
            self.total_tokens - other.total_tokens,
            self.cache_read_tokens - other.cache_read_tokens,
            self.cache_write_tokens - other.cache_write_tokens,
        )

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, *, cache_read_tokens: int = 0,
           cache_write_tokens: int = 0) -> TokenUsage:
        return cls(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens,
                   cache_read_tokens, cache_write_tokens)


ZERO_USAGE = TokenUsage()
