"""debatebus: multi-agent LLM debates served as event handlers on Redis and Kafka.

The top level holds what a first debate needs; the rest lives in its subpackage:
``debatebus.engine`` (prompts, transcripts, Φ̂…), ``debatebus.llm`` (real models),
``debatebus.handlers`` (the handler contract), ``debatebus.client`` (``BusClient``),
``debatebus.exceptions``, ``debatebus.checkpoints``, ``debatebus.transports``,
``debatebus.observability`` and ``debatebus.testing``.
"""

import debatebus.handlers  # noqa: F401  (registers what Debate.as_handler builds)
from debatebus.engine import Budget, Debate, DebateResult, Judge, Participant, Verdict
from debatebus.exceptions import DebatebusError
from debatebus.llm import FunctionLLM, LLMRequest, LLMResponse, ScriptedLLM
from debatebus.usage import TokenUsage
from debatebus.worker import DebateBus

__version__ = "0.1.0"

__all__ = [
    "Budget",
    "Debate",
    "DebateBus",
    "DebateResult",
    "DebatebusError",
    "FunctionLLM",
    "Judge",
    "LLMRequest",
    "LLMResponse",
    "Participant",
    "ScriptedLLM",
    "TokenUsage",
    "Verdict",
    "__version__",
]
