"""The package's public surface is explicit: ``__all__`` lists it and every name imports."""

from __future__ import annotations

import importlib
import types

import debatebus
import debatebus.engine

EXPECTED = {
    "LLM",
    "PROTOCOL_VERSION",
    "Budget",
    "BudgetExceededError",
    "BusClient",
    "ConfigError",
    "Debate",
    "DebateBus",
    "DebateHandler",
    "DebateResult",
    "DebateState",
    "DebatebusError",
    "DriftError",
    "FunctionLLM",
    "InputError",
    "Judge",
    "LLMError",
    "LLMRateLimitError",
    "LLMRequest",
    "LLMResponse",
    "LLMResponseError",
    "LLMTimeoutError",
    "LeaseLostError",
    "Message",
    "ModelRequestsNotAllowedError",
    "Participant",
    "Progress",
    "PromptContext",
    "Prompts",
    "Round",
    "ScriptExhaustedError",
    "ScriptedLLM",
    "TokenUsage",
    "Transcript",
    "TransportError",
    "Turn",
    "Utility",
    "Verdict",
    "__version__",
    "compute_phi_hat",
    "interpret_phi_hat",
    "tokenize",
}


def test_all_is_explicit_and_exactly_the_expected_names():
    assert isinstance(debatebus.__all__, list)
    assert len(debatebus.__all__) == len(set(debatebus.__all__))
    assert set(debatebus.__all__) == EXPECTED


def test_every_name_in_all_is_importable():
    for name in debatebus.__all__:
        assert getattr(debatebus, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from debatebus import *", namespace)
    assert namespace.keys() >= EXPECTED


def test_no_public_looking_name_is_left_out_of_all():
    public = {name for name in vars(debatebus) if not name.startswith("_")}
    missing = public - set(debatebus.__all__)
    assert all(isinstance(getattr(debatebus, name), types.ModuleType) for name in missing), missing


def test_engine_all_is_importable_and_reexported():
    for name in debatebus.engine.__all__:
        assert getattr(importlib.import_module("debatebus.engine"), name) is not None
    assert set(debatebus.engine.__all__) <= set(debatebus.__all__)


def test_version_is_a_string():
    assert isinstance(debatebus.__version__, str)
