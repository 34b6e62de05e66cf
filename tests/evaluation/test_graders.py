"""Graders: the number in prose (one extractor, checked by hypothesis), exact, regex, a judge."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from debatebus.evaluation import ExactGrader, Item, JudgeGrader, NumericGrader, RegexGrader
from debatebus.evaluation._graders import extract_number, number_key
from debatebus.exceptions import ConfigError, LLMResponseError
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM


@pytest.mark.parametrize(("text", "number"), [
    ("so the answer is 1,234.", Decimal(1234)),
    ("-3", Decimal(-3)),
    ("3.0", Decimal(3)),
    ("$12", Decimal(12)),
    ("It costs -$4.50 in total.", Decimal("-4.50")),
    ("First 5, then 10-4 = 6", Decimal(6)),
    ("10-4", Decimal(4)),  # a minus after a digit is the operator
    ("x = −7", Decimal(-7)),  # the Unicode minus sign
    ("The result is (-12).", Decimal(-12)),
    ("1,450,000 dollars", Decimal(1450000)),
    ("12.50", Decimal("12.5")),
    ("no number here", None),
    ("", None),
])
def test_the_last_number_is_read_from_prose(text: str, number: Decimal | None) -> None:
    assert extract_number(text) == number


def test_numbers_written_differently_have_one_key() -> None:
    assert number_key("3.0") == number_key("$3") == number_key("the answer is 3.") == "3"
    assert number_key("1,234.50") == "1234.5"
    assert number_key("-0") == "0"
    assert number_key("100") == "100"  # not 1E+2
    assert number_key("words") is None


PROSE = st.text(alphabet=st.characters(whitelist_categories=("L", "Zs")), max_size=40)


SHAPES = {
    "plain": lambda v: f"{v}",
    "thousands": lambda v: f"{v:,}",
    "dollars": lambda v: f"${v:,}" if v >= 0 else f"-${-v:,}",
    "point zero": lambda v: f"{v}.0",
    "full stop": lambda v: f"{v:,}.",
    "bold": lambda v: f"**{v:,}**",
}


@given(st.integers(min_value=-10**9, max_value=10**9), PROSE, st.sampled_from(sorted(SHAPES)))
def test_the_number_at_the_end_of_any_prose_is_found(value: int, prose: str, shape: str) -> None:
    text = f"{prose} 17 and then, so the answer is {SHAPES[shape](value)}"
    assert extract_number(text) == value
    assert number_key(text) == str(value)


@given(st.decimals(min_value=-10**6, max_value=10**6, places=3, allow_nan=False,
                   allow_infinity=False), PROSE)
def test_decimals_survive_prose(value: Decimal, prose: str) -> None:
    assert extract_number(f"{prose}: the total is {value:f}. Done") == value


async def test_numeric_grader_compares_numbers_not_text() -> None:
    grader = NumericGrader()
    item = Item("i", "What is 1000 + 234?", "1234")
    assert await grader.grade(item, "So the answer is 1,234.")
    assert await grader.grade(item, "1234.00")
    assert not await grader.grade(item, "It is 1,235.")
    assert not await grader.grade(item, "I do not know.")
    with pytest.raises(ConfigError, match="holds no number: grade this dataset with another"):
        await grader.grade(Item("j", "Capital of France?", "Paris"), "Paris")


async def test_exact_and_regex_graders() -> None:
    item = Item("i", "Capital of France?", "Paris")
    assert await ExactGrader().grade(item, "  paris. ")
    assert not await ExactGrader().grade(item, "It is Paris.")
    regex = RegexGrader(r"answer:\s*(\w+)")
    assert await regex.grade(item, "answer: Lyon ... no wait, answer: PARIS")
    assert regex.key("nothing") is None
    with pytest.raises(ConfigError, match="bad grader regex"):
        RegexGrader("(")


async def test_judge_grader_asks_a_model_with_the_reference() -> None:
    def grade(request: LLMRequest) -> object:
        return {"correct": "Paris" in request.prompt.split("Candidate answer:")[1]}

    llm = FunctionLLM(grade)
    grader = JudgeGrader(llm)
    item = Item("i", "Capital of France?", "Paris")
    assert await grader.grade(item, "The capital is Paris, on the Seine.")
    assert not await grader.grade(item, "Lyon.")
    request = llm.requests[0]
    assert request.purpose == "grade"
    assert "Reference answer: Paris" in request.prompt
    with pytest.raises(LLMResponseError, match="did not grade item i"):
        await JudgeGrader(FunctionLLM(lambda r: "I cannot say")).grade(item, "Paris")
