"""A scripted world where the right answers are known: 10 arithmetic items (seed 3), and models
whose answers depend on the item only, so an evaluation of them has a table worked out by hand.

- ``single`` is right on items 0–2 only (3/10).
- ``vote``'s samples: on items 0–7 the first four are right and the rest wrong, so the majority
  is right (8/10); on items 8 and 9 every sample is wrong.
- The debate (3 solvers × 2 rounds, round-robin, final answer the last round's majority) opens
  wrong everywhere and is right after the rebuttals (10/10): the debate fixes what one call got
  wrong. ``judged_debate``: the same solvers with a judge that rules consensus after round 1 on
  even items (the debate stops there, wrong) and never on odd ones (3 rounds): its calls per item
  differ.

Used in process by the tests and by ``fleet_app`` (a worker serving the same debate).
"""

from __future__ import annotations

import re
from typing import Any

from debatebus import Debate, Judge
from debatebus.evaluation import Dataset, arithmetic
from debatebus.evaluation._arms import solver_debate
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM

DATASET: Dataset = arithmetic(10, seed=3)
_QUESTION = re.compile(r"What is the result of [0-9+*-]+\?")
_INDEX = {item.question: i for i, item in enumerate(DATASET.items)}
VOTE_RIGHT = 4  # of each item's first samples, on items 0–7


def item_of(request: LLMRequest) -> tuple[int, int]:
    """The item a request is about (found in its prompt) and its right answer."""
    found = _QUESTION.search(request.prompt)
    assert found is not None, request.prompt
    index = _INDEX[found.group(0)]
    return index, int(DATASET.items[index].reference)


def say(value: int) -> str:
    return f"Working it out step by step, so the answer is {value:,}."


def answer(request: LLMRequest) -> Any:
    index, right = item_of(request)
    wrong = right + 7
    if request.purpose == "judge":
        return {"consensus": index % 2 == 0, "summary": f"They settle on item {index}."}
    if request.purpose == "single":
        return say(right if index < 3 else wrong)
    if request.purpose == "sample":
        return say(right if index < 8 and request.round <= VOTE_RIGHT else wrong)
    return say(wrong if request.round == 1 else right)  # a debater: wrong, then fixed


def world_llm() -> FunctionLLM:
    return FunctionLLM(answer, model="world")


def world_debate(llm: Any = None) -> Debate:
    return solver_debate(llm or world_llm(), agents=3, rounds=2)


def judged_debate(llm: Any = None) -> Debate:
    """The world's debate with a judge, 3 rounds at most: stops after round 1 on even items."""
    return Debate("judged", [*solver_debate(llm or world_llm()).participants],
                  llm=llm or world_llm(), judge=Judge(), max_rounds=3)


#: The world's debate as ``debatebus eval --arm debate:tests.evaluation.world:DEBATE`` loads it.
DEBATE = world_debate()
