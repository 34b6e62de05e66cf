"""The embedded model through an evaluation: one short item, to show the path end to end. What
it answers is not checked (a 135M model samples): only that it was asked, counted and graded."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.llm import HAVE_LLAMA, NO_LLAMA

from debatebus.evaluation import Evaluation, Single, Vote, arithmetic

pytestmark = [pytest.mark.local_llm, pytest.mark.skipif(not HAVE_LLAMA, reason=NO_LLAMA)]


async def test_the_embedded_model_is_asked_counted_and_graded(tmp_path: Path) -> None:
    from debatebus.llm._local import LocalLLM

    llm = LocalLLM(seed=3, max_tokens=8, n_threads=2)
    arms = [Single(llm), Vote(llm, k=2)]
    report = await Evaluation(arithmetic(1, seed=0), arms).run(tmp_path / "items.jsonl")
    single, vote = report.arm("single"), report.arm("vote")
    assert (single.calls, vote.calls) == (1, 2)
    assert single.prompt_tokens is not None and single.prompt_tokens > 20
    assert vote.prompt_tokens == 2 * single.prompt_tokens  # the same prompt, sampled twice
    assert 0 < (vote.completion_tokens or 0) <= 2 * 8
    assert llm.stats.calls == 3
    assert report.config["arms"]["single"]["model"] == llm.model
