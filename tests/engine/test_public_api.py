"""The package's public surface is explicit: ``__all__`` lists it and every name imports."""

from __future__ import annotations

import importlib
import types

import debatebus
import debatebus.engine

#: What a user writes in the first hour; everything else is imported from its subpackage.
EXPECTED = [
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

#: Names that left the top level, and where they are imported from now.
MOVED = {
    "debatebus.engine": ["PROTOCOL_VERSION", "DebateState", "Progress", "PromptContext", "Prompts",
                         "Round", "Transcript", "Turn", "Utility", "compute_phi_hat",
                         "interpret_phi_hat", "tokenize"],
    "debatebus.exceptions": ["BudgetExceededError", "ConfigError", "DriftError", "InputError",
                             "LLMError", "LLMRateLimitError", "LLMResponseError", "LLMTimeoutError",
                             "LeaseLostError", "ModelRequestsNotAllowedError", "NotSupportedError",
                             "ScriptExhaustedError", "TransportError"],
    "debatebus.llm": ["LLM", "Message"],
    "debatebus.handlers": ["BusHandler", "DebateHandler", "HandlerContext", "HandlerResult"],
    "debatebus.client": ["BusClient"],
}


def test_all_is_explicit_and_exactly_the_expected_names():
    assert isinstance(debatebus.__all__, list)
    assert debatebus.__all__ == EXPECTED


def test_every_name_in_all_is_importable():
    for name in debatebus.__all__:
        assert getattr(debatebus, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from debatebus import *", namespace)
    assert namespace.keys() >= set(EXPECTED)


def test_no_public_looking_name_is_left_out_of_all():
    public = {name for name in vars(debatebus) if not name.startswith("_")}
    missing = public - set(debatebus.__all__)
    assert all(isinstance(getattr(debatebus, name), types.ModuleType) for name in missing), missing


def test_engine_all_is_importable():
    for name in debatebus.engine.__all__:
        assert getattr(importlib.import_module("debatebus.engine"), name) is not None


def test_moved_names_import_from_their_subpackage():
    for module, names in MOVED.items():
        imported = importlib.import_module(module)
        for name in names:
            assert name in imported.__all__, (module, name)
            assert getattr(imported, name) is not None
            assert not hasattr(debatebus, name) or name in EXPECTED, name


def test_version_is_a_string():
    assert isinstance(debatebus.__version__, str)
