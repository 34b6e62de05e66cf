"""What calls cost in money: a price table per model, and what a debate cost (``debateCost``).

Prices are per million tokens, in one currency per table: input (uncached), cached input (a
prompt-cache read), cache write (Anthropic bills a write above the input price; OpenAI writes
nothing, so its cache-write price is its input price) and output. A cost is computed only from
prices given for the very model name a call was made with: a model missing from the table has no
cost, never an estimate (``Prices.cost`` is None, and a debate that used it has no ``debateCost``).

``DEFAULT_PRICES`` holds the list prices of a few models on api.openai.com and api.anthropic.com
as of ``DEFAULT_PRICES.as_of``. They are nobody's default until passed (``Debate(prices=...)``):
a model name alone does not say which server answers it at which price. Override or extend them
(``DEFAULT_PRICES.updated(...)``), or load a table of your own from JSON or TOML
(``Prices.from_file``)::

    currency = "USD"
    as_of = "2025-11-01"
    [models."gpt-4o-mini"]
    input = 0.15
    cached_input = 0.075
    cache_write = 0.15
    output = 0.60
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from debatebus._usage import TokenUsage
from debatebus.exceptions import ConfigError
from debatebus.schemas.cost import DebateCost

_PER = 1_000_000.0
#: Costs are rounded to this many decimals: float noise, not money (a millionth of a cent).
_DECIMALS = 8


@dataclass(frozen=True, slots=True)
class Price:
    """One model's prices per million tokens: ``input`` (uncached), ``cached_input`` (read from
    the prompt cache), ``cache_write`` (written to it) and ``output``."""

    input: float
    cached_input: float
    cache_write: float
    output: float

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    math.isfinite(value) and value >= 0):
                raise ConfigError(f"Price {f.name} must be a number ≥ 0 per million tokens, not "
                                  f"{value!r}")

    def cost(self, usage: TokenUsage) -> float:
        """What ``usage`` costs at these prices."""
        uncached = usage.prompt_tokens - usage.cache_read_tokens - usage.cache_write_tokens
        return (uncached * self.input + usage.cache_read_tokens * self.cached_input
                + usage.cache_write_tokens * self.cache_write
                + usage.completion_tokens * self.output) / _PER


class Prices:
    """Prices by model name, in one ``currency``; ``as_of`` dates them (None: undated)."""

    __slots__ = ("as_of", "currency", "models")

    def __init__(self, models: Mapping[str, Price], *, currency: str = "USD",
                 as_of: str | None = None) -> None:
        if not isinstance(currency, str) or not currency.strip():
            raise ConfigError(f"Prices need a currency such as 'USD', not {currency!r}")
        for name, price in models.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(f"a price is given for the model name {name!r}: name a model")
            if not isinstance(price, Price):
                raise ConfigError(f"the price of {name!r} must be a Price, not "
                                  f"{type(price).__name__}")
        self.models: Mapping[str, Price] = MappingProxyType(dict(models))
        self.currency = currency.strip()
        self.as_of = as_of

    def __repr__(self) -> str:
        dated = f", as_of={self.as_of!r}" if self.as_of else ""
        return f"Prices({len(self.models)} models, currency={self.currency!r}{dated})"

    def price_of(self, model: str) -> Price | None:
        return self.models.get(model)

    def cost(self, model: str, usage: TokenUsage) -> float | None:
        """What ``usage`` on ``model`` costs; None when the table has no price for ``model``."""
        price = self.models.get(model)
        return None if price is None else price.cost(usage)

    def missing(self, models: list[str] | set[str] | tuple[str, ...]) -> list[str]:
        """Those of ``models`` the table has no price for, sorted."""
        return sorted({m for m in models if m not in self.models})

    def updated(self, other: Prices | Mapping[str, Price]) -> Prices:
        """This table with ``other``'s prices added, replacing those of the same models. A table
        in another currency is refused; ``other``'s date, when it has one, dates the result."""
        if isinstance(other, Prices):
            if other.currency != self.currency:
                raise ConfigError(f"cannot update {self.currency} prices with {other.currency} "
                                  "ones: give every price of one table in one currency")
            return Prices({**self.models, **other.models}, currency=self.currency,
                          as_of=other.as_of or self.as_of)
        return Prices({**self.models, **other}, currency=self.currency, as_of=self.as_of)

    def debate_cost(self, participants: Mapping[str, float], children: float = 0.0) -> DebateCost:
        """A debate's cost: what each speaker's calls cost at these prices, plus what its
        sub-debates cost (``children``, in this currency)."""
        own = {name: round(cost, _DECIMALS) for name, cost in participants.items()}
        total = math.fsum(participants.values()) + children
        return DebateCost(self.currency, round(total, _DECIMALS), own, round(children, _DECIMALS),
                          self.as_of)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "prices") -> Prices:
        """A table from ``{"currency", "as_of", "models": {name: {input, cached_input,
        cache_write, output}}}`` (what ``from_file`` reads)."""
        models = data.get("models")
        if not isinstance(models, Mapping) or not models:
            raise ConfigError(f"{source}: needs a 'models' table of model names to prices")
        unknown = sorted(set(data) - {"currency", "as_of", "models"})
        if unknown:
            raise ConfigError(f"{source}: unknown keys {unknown} (use currency, as_of, models)")
        parsed = {}
        names = [f.name for f in fields(Price)]
        for name, entry in models.items():
            if not isinstance(entry, Mapping) or set(entry) != set(names):
                raise ConfigError(f"{source}: the price of {name!r} needs exactly {names} (per "
                                  f"million tokens), got {entry!r}")
            parsed[name] = Price(**{key: entry[key] for key in names})
        as_of = data.get("as_of")
        return cls(parsed, currency=data.get("currency", "USD"),
                   as_of=None if as_of is None else str(as_of))

    @classmethod
    def from_file(cls, path: str | Path) -> Prices:
        """A table from a ``.json`` or ``.toml`` file (the module's docstring shows the shape)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read prices from {path}: {exc.strerror}") from None
        try:
            data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}") \
                from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: needs a table with 'models', not {type(data).__name__}")
        return cls.from_dict(data, source=str(path))


def _anthropic(input: float, output: float) -> Price:
    """Anthropic's rates: a 5-minute cache write costs 1.25× input, a read 0.1×."""
    return Price(input, round(input * 0.1, 6), round(input * 1.25, 6), output)


def _openai(input: float, cached: float, output: float) -> Price:
    """OpenAI's rates: no cache-write premium (it reports no writes)."""
    return Price(input, cached, input, output)


_DEFAULTS = {
    "claude-opus-4-5": _anthropic(5.0, 25.0),
    "claude-opus-4-5-20251101": _anthropic(5.0, 25.0),
    "claude-opus-4-1": _anthropic(15.0, 75.0),
    "claude-opus-4-1-20250805": _anthropic(15.0, 75.0),
    "claude-sonnet-4-5": _anthropic(3.0, 15.0),
    "claude-sonnet-4-5-20250929": _anthropic(3.0, 15.0),
    "claude-sonnet-4-0": _anthropic(3.0, 15.0),
    "claude-sonnet-4-20250514": _anthropic(3.0, 15.0),
    "claude-haiku-4-5": _anthropic(1.0, 5.0),
    "claude-haiku-4-5-20251001": _anthropic(1.0, 5.0),
    "claude-3-5-haiku-latest": _anthropic(0.8, 4.0),
    "claude-3-5-haiku-20241022": _anthropic(0.8, 4.0),
    "gpt-4o": _openai(2.5, 1.25, 10.0),
    "gpt-4o-2024-08-06": _openai(2.5, 1.25, 10.0),
    "gpt-4o-2024-11-20": _openai(2.5, 1.25, 10.0),
    "gpt-4o-mini": _openai(0.15, 0.075, 0.6),
    "gpt-4o-mini-2024-07-18": _openai(0.15, 0.075, 0.6),
    "gpt-4.1": _openai(2.0, 0.5, 8.0),
    "gpt-4.1-2025-04-14": _openai(2.0, 0.5, 8.0),
    "gpt-4.1-mini": _openai(0.4, 0.1, 1.6),
    "gpt-4.1-mini-2025-04-14": _openai(0.4, 0.1, 1.6),
    "gpt-4.1-nano": _openai(0.1, 0.025, 0.4),
    "gpt-4.1-nano-2025-04-14": _openai(0.1, 0.025, 0.4),
    "gpt-5": _openai(1.25, 0.125, 10.0),
    "gpt-5-2025-08-07": _openai(1.25, 0.125, 10.0),
    "gpt-5-mini": _openai(0.25, 0.025, 2.0),
    "gpt-5-mini-2025-08-07": _openai(0.25, 0.025, 2.0),
}

DEFAULT_PRICES = Prices(_DEFAULTS, currency="USD", as_of="2025-11-01")
"""List prices (USD per million tokens, standard tier, 5-minute cache writes) of a few models on
api.openai.com and api.anthropic.com, as published on ``as_of``. Check them against the providers'
pricing pages before you bill anyone; ``DEFAULT_PRICES.updated({...})`` overrides any."""
