"""The public surface, pinned: changing it is deliberate (edit SURFACE in the same commit).

Public modules are the packages and modules whose dotted names have no ``_``-prefixed part; their
``__all__`` is the API, every name of it imports, and private modules (``_``-prefixed, free to
change) declare none (tests/test_structure.py). The names the top level exported before 0.3 still
import from it, with a DeprecationWarning that says where they live now.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings

import pytest

import debatebus

SURFACE: dict[str, list[str]] = {
    'debatebus': [
        'Budget', 'BusClient', 'Debate', 'DebateBus', 'DebatebusError', 'Judge', 'Participant',
        '__version__',
    ],
    'debatebus.asyncapi': [
        'ASYNCAPI_VERSION', 'DeadLetterHeaders', 'RedisDeadLetterEntry', 'RequestPayload',
        'ResultPayload', 'build_asyncapi', 'schema_components',
    ],
    'debatebus.checkpoints': [
        'CheckpointStore', 'Counters', 'DEFAULT_RETENTION_S', 'Lease', 'MemoryCheckpointStore',
        'RedisCheckpointStore', 'SQLiteCheckpointStore', 'StoredCheckpoint', 'store_for_broker',
        'store_from_url',
    ],
    'debatebus.cli': [
        'list_failures', 'main', 'parse_since', 'replay_range',
    ],
    'debatebus.client': [
        'Answers', 'BusClient', 'EVENTS_GRACE_S', 'RequestStream', 'request_message',
    ],
    'debatebus.engine': [
        'Budget', 'Debate', 'DebateMetrics', 'DebateResult', 'DebateState', 'HumanParticipant',
        'Judge', 'PRESETS', 'PROTOCOL_VERSION', 'Participant', 'Preset', 'Progress',
        'PromptContext', 'Prompts', 'Round', 'StopReason', 'SubDebates', 'Transcript', 'Turn',
        'TurnKey', 'TurnText', 'Utility', 'Verdict', 'compute_phi_hat', 'interpret_phi_hat',
        'preset', 'tokenize',
    ],
    'debatebus.evaluation': [
        'Answer', 'Arm', 'ArmSummary', 'Ask', 'Dataset', 'DebateArm', 'Evaluation', 'ExactGrader',
        'FleetArm', 'Grader', 'HandlerArm', 'Interval', 'Item', 'ItemResult', 'JudgeGrader',
        'NumericGrader', 'Paired', 'Progress', 'RegexGrader', 'Report', 'Single', 'Vote',
        'arithmetic', 'extract_number', 'gsm8k', 'jsonl', 'majority', 'mcnemar_exact',
        'read_result', 'solver_debate', 'wilson_interval',
    ],
    'debatebus.exceptions': [
        'BudgetExceededError', 'BudgetLimit', 'CheckpointMissingError', 'ConfigError',
        'DebatebusError', 'DriftError', 'InputError', 'LLMError', 'LLMRateLimitError',
        'LLMResponseError', 'LLMTimeoutError', 'LeaseLostError', 'MessageTooLargeError',
        'ModelRequestsNotAllowedError', 'NotSupportedError', 'ScriptExhaustedError',
        'SpendLimitError', 'TransportError',
    ],
    'debatebus.handlers': [
        'BusChildren', 'BusHandler', 'DebateHandler', 'Handler', 'HandlerContext',
        'HandlerOptions', 'HandlerResult', 'PlainHandler', 'attach_default_stores', 'changed',
        'fork', 'no_default_store_warning', 'turn_reply',
    ],
    'debatebus.integrations': [
        'Flow', 'Outlet',
    ],
    'debatebus.integrations.faststream': [
        'mount',
    ],
    'debatebus.llm': [
        'ALLOW_MODEL_REQUESTS', 'AnthropicLLM', 'DEFAULT_PRICES', 'FunctionLLM', 'LLM',
        'LLMRequest', 'LLMResponse', 'LLMStream', 'LocalLLM', 'MemoryRateLimiter',
        'MemorySpendLimiter', 'Message', 'OpenAICompatibleLLM', 'PAID_HOST_SUFFIXES', 'Price',
        'Prices', 'RateLimit', 'RateLimitedLLM', 'RateLimiter', 'RedisRateLimiter',
        'RedisSpendLimiter', 'ScriptedLLM', 'SpendLimit', 'SpendLimitedLLM', 'SpendLimiter',
        'TokenUsage', 'check_model_requests_allowed', 'is_loopback_url', 'is_paid_url',
        'model_name', 'model_requests_allowed', 'override_allow_model_requests', 'resolve_llm',
        'with_rate_limits',
    ],
    'debatebus.observability': [
        'HEARTBEAT_TOPIC', 'LoggingObserver', 'Observer', 'PrometheusObserver', 'RequestContext',
        'Settlement', 'TracingObserver', 'beat_forever', 'configure_logging', 'inject_traceparent',
        'latest_heartbeat', 'redact', 'start_metrics_server',
    ],
    'debatebus.observe': [
        'Observer', 'Outcome', 'RequestContext',
    ],
    'debatebus.presets': [
        'PRESETS', 'Preset', 'preset',
    ],
    'debatebus.schemas': [
    ],
    'debatebus.schemas.cost': [
        'DebateCost',
    ],
    'debatebus.schemas.envelope': [
        'ENVELOPE_DECODER', 'ENVELOPE_ENCODER', 'Envelope', 'SCHEMA_VERSION', 'answer_message_id',
        'completed_topic', 'decode_request', 'failed_topic', 'is_result_topic', 'lenient_request',
        'new_message_id', 'now_iso',
    ],
    'debatebus.schemas.events': [
        'BUS_EVENT_DECODER', 'BusEvent', 'DebateCompleted', 'DebateEvent', 'DebateFailed',
        'DebateStarted', 'EVENT_DECODER', 'EVENT_TYPES', 'FramingCompleted', 'PhiUpdate',
        'RoundCompleted', 'RoundStarted', 'SubDebateCompleted', 'SubDebateFailed',
        'SubDebateSkipped', 'SubDebateStarted', 'SynthesisCompleted', 'TurnCompleted', 'TurnDelta',
        'TurnFailed', 'TurnRequested', 'VerdictReached',
    ],
    'debatebus.schemas.result': [
        'HandlerResult', 'Status',
    ],
    'debatebus.testing': [
        'DebateTestBus', 'FunctionLLM', 'ScriptedLLM',
    ],
    'debatebus.transports': [
        'DEFAULT_BROKER', 'Delivery', 'MemoryBroker', 'MemoryTransport', 'Outgoing',
        'SynkroDialect', 'Transport', 'WireDialect', 'broker_url', 'dlq_topic', 'redis_server_url',
        'step_channel', 'transport_from_url',
    ],
    'debatebus.transports.kafka': [
        'CONTENT_TYPE_HEADER', 'KafkaSettings', 'KafkaTransport', 'SCHEMA_HEADER', 'kafka_topic',
    ],
    'debatebus.web': [
        'build_server', 'create_app',
    ],
}

#: The names the top level exported before 0.3, and where they live now.
MOVED = {
    "DebateResult": "debatebus.engine",
    "Verdict": "debatebus.engine",
    "FunctionLLM": "debatebus.testing",
    "ScriptedLLM": "debatebus.testing",
    "LLMRequest": "debatebus.llm",
    "LLMResponse": "debatebus.llm",
    "TokenUsage": "debatebus.llm",
}


def public_modules() -> list[str]:
    names = ["debatebus"]
    for info in pkgutil.walk_packages(debatebus.__path__, "debatebus."):
        if not any(part.startswith("_") for part in info.name.split(".")[1:]):
            names.append(info.name)
    return sorted(names)


def test_the_public_modules_are_the_pinned_ones() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # debatebus.observe, .presets
        assert public_modules() == sorted(SURFACE)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("name", sorted(SURFACE))
def test_each_public_module_exports_its_pinned_names_and_each_imports(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(module.__all__) == SURFACE[name]
    missing: list[str] = []
    for exported in module.__all__:
        try:
            value = getattr(module, exported)
        except ImportError as exc:  # a provider whose optional extra is not installed here
            missing.append(f"{exported}: {exc}")
            continue
        assert value is not None, f"{name}.{exported}"
    # Each name that needs an extra says how to install it.
    assert all("install" in why for why in missing), missing


def test_the_top_level_is_what_a_first_debate_and_a_first_caller_need() -> None:
    assert set(debatebus.__all__) == {"Budget", "BusClient", "Debate", "DebateBus",
                                      "DebatebusError", "Judge", "Participant", "__version__"}


@pytest.mark.parametrize(("name", "home"), sorted(MOVED.items()))
def test_an_old_top_level_name_still_imports_with_a_warning_saying_where_it_lives(
        name: str, home: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"import it from {home}"):
        value = getattr(debatebus, name)
    assert value is getattr(importlib.import_module(home), name)


def test_from_import_of_an_old_name_warns_too() -> None:
    with pytest.warns(DeprecationWarning, match="debatebus.ScriptedLLM is deprecated"):
        exec("from debatebus import ScriptedLLM", {})


def test_the_new_names_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec("from debatebus import BusClient, Debate, DebateBus", {})


def test_an_unknown_top_level_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        debatebus.Nope  # noqa: B018
