"""Model strings for the CLI and configuration: ``resolve_llm("openai:gpt-4o-mini")`` → an LLM.

Providers are imported only when their string is resolved, so a missing optional extra only
matters to the people who ask for it (its ImportError carries the install hint).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from debatebus._redaction import redact
from debatebus.exceptions import ConfigError
from debatebus.llm._base import LLM
from debatebus.llm._fakes import ScriptedLLM

ENV_VAR = "DEBATEBUS_LLM"
DEFAULT_SPEC = "local"
ACCEPTED_FORMS = (
    "'local' (the embedded SmolLM2 model) or 'local:PATH.gguf', "
    "'openai:MODEL' (e.g. openai:gpt-4o-mini), 'openai:MODEL@http://host:port/v1' "
    "(any OpenAI-compatible server), 'anthropic:MODEL', "
    "'scripted:FILE.json' (a JSON list of responses: strings or objects)"
)
_AT_URL = re.compile(r"^(?P<model>.+?)@(?P<url>https?://\S+)$")


def _bad(spec: str, why: str) -> ConfigError:
    shown = redact(spec)  # the spec may carry a base URL with a password or key
    return ConfigError(f"bad model string {shown!r}: {why}; accepted forms: {ACCEPTED_FORMS}")


def _local(spec: str, rest: str) -> LLM:
    from debatebus.llm._local import LocalLLM

    return LocalLLM(rest or None)


def _openai(spec: str, rest: str) -> LLM:
    from debatebus.llm._openai_compat import OpenAICompatibleLLM

    match = _AT_URL.match(rest)
    if match:
        return OpenAICompatibleLLM(match["model"], base_url=match["url"])
    if "@" in rest:
        raise _bad(spec, "the part after '@' must be an http:// or https:// base URL")
    return OpenAICompatibleLLM(rest)


def _anthropic(spec: str, rest: str) -> LLM:
    from debatebus.llm._anthropic_llm import AnthropicLLM

    return AnthropicLLM(rest)


def _scripted(spec: str, rest: str) -> LLM:
    path = Path(rest)
    try:
        responses: Any = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _bad(spec, f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise _bad(spec, f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(responses, list) or not all(isinstance(r, str | dict) for r in responses):
        raise _bad(spec, f"{path} must hold a JSON list of strings and objects")
    return ScriptedLLM(responses, model=f"scripted:{path.name}")


_PROVIDERS = {"local": _local, "openai": _openai, "anthropic": _anthropic, "scripted": _scripted}
_NEEDS_ARGUMENT = {"openai": "a model name", "anthropic": "a model name", "scripted": "a file"}


def resolve_llm(spec: str | None = None) -> LLM:
    """The LLM a model string names; ``spec`` defaults to ``$DEBATEBUS_LLM``, then ``local``."""
    spec = (spec or os.environ.get(ENV_VAR) or DEFAULT_SPEC).strip()
    provider, _, rest = spec.partition(":")
    build = _PROVIDERS.get(provider.lower())
    if build is None:
        raise _bad(spec, f"unknown provider {provider!r}")
    rest = rest.strip()
    if not rest and provider.lower() in _NEEDS_ARGUMENT:
        raise _bad(spec, f"{provider} needs {_NEEDS_ARGUMENT[provider.lower()]} after the colon")
    return build(spec, rest)
