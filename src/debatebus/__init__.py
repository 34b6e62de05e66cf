"""debatebus: multi-agent LLM debates served as event handlers on Redis and Kafka.

The top level is what a first debate and a first caller need: ``Debate``, ``Participant``,
``Judge`` and ``Budget`` to write one, ``DebateBus`` to serve it, ``BusClient`` to ask a deployed
worker, ``DebatebusError`` to catch. Each subpackage exports its own API: ``debatebus.engine``
(results, transcripts, prompts, Φ̂), ``debatebus.llm`` (models, rate and spend limits),
``debatebus.handlers``, ``debatebus.checkpoints``, ``debatebus.transports``,
``debatebus.observability``, ``debatebus.evaluation``, ``debatebus.schemas`` (the wire) and
``debatebus.testing`` (fake models and an in-memory test bus). Modules whose names start with
``_`` are internal and change without notice.
"""

import warnings
from typing import Any

from debatebus import engine as _engine
from debatebus import handlers as _handlers  # noqa: F401  (registers what Debate.as_handler builds)
from debatebus import llm as _llm
from debatebus._worker import DebateBus
from debatebus.client import BusClient
from debatebus.engine import Budget, Debate, Judge, Participant
from debatebus.exceptions import DebatebusError

__version__ = "0.1.0"

__all__ = [
    "Budget",
    "BusClient",
    "Debate",
    "DebateBus",
    "DebatebusError",
    "Judge",
    "Participant",
    "__version__",
]

#: Names the top level exported before 0.3, and where they live now: importable from here, with
#: a DeprecationWarning, until 0.4.
_MOVED: dict[str, tuple[str, object]] = {
    "DebateResult": ("debatebus.engine", _engine.DebateResult),
    "Verdict": ("debatebus.engine", _engine.Verdict),
    "FunctionLLM": ("debatebus.testing", _llm.FunctionLLM),
    "ScriptedLLM": ("debatebus.testing", _llm.ScriptedLLM),
    "LLMRequest": ("debatebus.llm", _llm.LLMRequest),
    "LLMResponse": ("debatebus.llm", _llm.LLMResponse),
    "TokenUsage": ("debatebus.llm", _llm.TokenUsage),
}


def __getattr__(name: str) -> Any:
    moved = _MOVED.get(name)
    if moved is None:
        raise AttributeError(f"module 'debatebus' has no attribute {name!r}")
    home, value = moved
    warnings.warn(f"debatebus.{name} is deprecated and goes in 0.4: import it from {home} "
                  f"(from {home} import {name})", DeprecationWarning, stacklevel=2)
    return value
