"""Model strings: every accepted form, the DEBATEBUS_LLM default, and clear errors for bad ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from debatebus._redaction import redact
from debatebus.exceptions import ConfigError
from debatebus.llm import (
    AnthropicLLM,
    LLMRequest,
    Message,
    OpenAICompatibleLLM,
    ScriptedLLM,
    resolve_llm,
)
from tests.support.llm import HAVE_LLAMA, NO_LLAMA


class Verdict(BaseModel):
    consensus: bool
    summary: str


def test_openai_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-from-env-000000")
    llm = resolve_llm("openai:gpt-4o-mini")
    assert isinstance(llm, OpenAICompatibleLLM)
    assert llm.model == "gpt-4o-mini"
    assert llm.base_url.startswith("https://api.openai.com/")


@pytest.mark.parametrize(("spec", "variable"), [
    ("openai:gpt-4o-mini", "OPENAI_API_KEY"),
    ("anthropic:claude-3-5-haiku-latest", "ANTHROPIC_API_KEY"),
])
def test_no_key_is_refused_when_the_llm_is_built_in_words_that_survive_redaction(
        spec: str, variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_llm(spec)
    message = str(info.value)
    assert f"set {variable} or pass api_key=..." in message
    assert redact(message) == message  # logs and the CLI redact: the hint reads the same there


def test_an_anthropic_auth_token_is_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "an-auth-token-000000")
    assert resolve_llm("anthropic:claude-x").model == "claude-x"


def test_the_cli_refuses_a_keyless_model_before_serving(capsys: pytest.CaptureFixture[str]) -> None:
    from debatebus.cli import main

    code = main(["demo", "--broker", "memory://", "--llm", "anthropic:claude-x"])
    printed = capsys.readouterr().err
    assert code == 2
    assert printed.strip() == (
        "debatebus: claude-x: no API key for https://api.anthropic.com: "
        "set ANTHROPIC_API_KEY or pass api_key=...")


def test_openai_model_at_a_local_server() -> None:
    llm = resolve_llm("openai:qwen2.5:0.5b@http://127.0.0.1:11434/v1")
    assert isinstance(llm, OpenAICompatibleLLM)
    assert llm.model == "qwen2.5:0.5b"  # Ollama-style names keep their colon
    assert llm.base_url == "http://127.0.0.1:11434/v1/"


def test_anthropic_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-from-env-000000")
    llm = resolve_llm("anthropic:claude-3-5-haiku-latest")
    assert isinstance(llm, AnthropicLLM)
    assert llm.model == "claude-3-5-haiku-latest"


async def test_scripted_file(tmp_path: Path) -> None:
    script = tmp_path / "debate.json"
    script.write_text(json.dumps(["first", {"consensus": True, "summary": "done"}]))
    llm = resolve_llm(f"scripted:{script}")
    assert isinstance(llm, ScriptedLLM)
    assert llm.model == "scripted:debate.json"
    assert (await llm.complete(LLMRequest("s", (Message("user", "u"),)))).text == "first"
    judged = await llm.complete(LLMRequest("s", (Message("user", "u"),), response_schema=Verdict))
    assert judged.structured == Verdict(consensus=True, summary="done")


def test_default_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEBATEBUS_LLM", "anthropic:claude-x")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-from-env-000000")
    assert resolve_llm().model == "claude-x"
    assert resolve_llm("openai:gpt-x@http://127.0.0.1:1/v1").model == "gpt-x"  # explicit wins


@pytest.mark.skipif(not HAVE_LLAMA, reason=NO_LLAMA)
def test_local_is_the_default_and_loads_nothing_yet() -> None:
    from debatebus.llm import LocalLLM

    llm = resolve_llm()
    assert isinstance(llm, LocalLLM)
    assert llm.model.startswith("SmolLM2-135M-Instruct")
    assert llm._llama is None  # lazily loaded on the first call


@pytest.mark.skipif(not HAVE_LLAMA, reason=NO_LLAMA)
def test_local_with_a_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no model file"):
        resolve_llm(f"local:{tmp_path / 'missing.gguf'}")


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("gpt-4o-mini", "unknown provider 'gpt-4o-mini'"),
        ("mistral:large", "unknown provider 'mistral'"),
        ("openai:", "openai needs a model name"),
        ("anthropic:", "anthropic needs a model name"),
        ("scripted:", "scripted needs a file"),
        ("openai:m@ftp://host", "must be an http:// or https:// base URL"),
    ],
)
def test_bad_specs_list_the_accepted_forms(spec: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_llm(spec)
    message = str(info.value)
    assert why in message
    assert "openai:MODEL@http://host:port/v1" in message
    assert "scripted:FILE.json" in message


@pytest.mark.parametrize(
    ("content", "why"),
    [(None, "cannot read"), ("{oops", "not valid JSON"), ('{"a": 1}', "JSON list")],
)
def test_bad_script_files(tmp_path: Path, content: str | None, why: str) -> None:
    path = tmp_path / "script.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=why):
        resolve_llm(f"scripted:{path}")


def test_providers_load_only_when_asked_for() -> None:
    code = (
        "import sys, debatebus, debatebus.llm as llm; "
        "assert not {'openai', 'anthropic', 'llama_cpp'} & set(sys.modules), sorted(sys.modules); "
        "llm.OpenAICompatibleLLM; assert 'openai' in sys.modules and 'anthropic' not in sys.modules; "
        "print(llm.ALLOW_MODEL_REQUESTS)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
