"""Fixtures for the provider tests: a scriptable fake HTTP API and llama-cpp-python's real server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import debatebus.llm
from tests.llm.servers import FakeAPI, LlamaServer
from tests.support.llm import HAVE_LLAMA, NO_LLAMA

# No test may reach a paid provider, whatever the environment holds (loopback stays allowed).
debatebus.llm.ALLOW_MODEL_REQUESTS = False



@pytest.fixture(autouse=True)
def _no_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys and base URLs from the developer's shell must not leak into what tests construct."""
    for name in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_AUTH_TOKEN",
        "DEBATEBUS_LLM",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def fake_api_server() -> Iterator[FakeAPI]:
    server = FakeAPI().start()
    yield server
    server.stop()


@pytest.fixture
def fake_api(fake_api_server: FakeAPI) -> Iterator[FakeAPI]:
    fake_api_server.reset()
    yield fake_api_server
    fake_api_server.reset()


@pytest.fixture(scope="session")
def model_path() -> Path:
    if not HAVE_LLAMA:
        pytest.skip(NO_LLAMA)
    from debatebus.llm._local import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def llama_server(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    server = LlamaServer.start(model_path, log, n_threads=2)
    yield server
    server.stop()
