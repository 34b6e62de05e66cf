"""Whether an answer is right: numeric (the last number in it), exact match, a regex, or a judge
model for free text.

A grader also gives an answer's *key*, the value it compares: a vote counts samples by it, and a
debate's final answer can be the majority of its participants' keys. ``extract_number`` is the one
place a number is read out of prose.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, Protocol

from pydantic import BaseModel, Field, ValidationError

from debatebus.evaluation._datasets import Item
from debatebus.exceptions import ConfigError, LLMResponseError
from debatebus.llm._base import LLM, LLMRequest, Message, model_name
from debatebus.llm._structured import InvalidStructuredOutput, parse_structured

# A number as people write it: an optional minus sign (not one that follows a word, a digit or a
# closing bracket: "10-4" is 10 and 4), an optional "$", digits with or without thousands commas,
# and a decimal part (a full stop with no digit after it ends the sentence, not the number).
_NUMBER = re.compile(
    r"(?:(?<![\w)\]])(?P<sign>[-−]))?\$?(?P<whole>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<part>\.\d+)?"
)


def extract_number(text: str) -> Decimal | None:
    """The last number in ``text`` ("so the answer is 1,234." → 1234; "-3", "3.0", "$12"), or
    None when it holds none."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    sign, whole, part = matches[-1]
    value = Decimal(whole.replace(",", "") + part)  # only digits, a point and digits
    return -value if sign else value


def number_key(text: str) -> str | None:
    """The last number in ``text`` written one way only ("3.0", "3" and "$3" → "3"), or None."""
    value = extract_number(text)
    if value is None:
        return None
    return "0" if value == 0 else format(value.normalize(), "f")


class Grader(Protocol):
    """How answers are compared with an item's reference."""

    @property
    def name(self) -> str: ...

    def key(self, answer: str) -> str | None:
        """The value ``answer`` gives, as this grader compares it (None: it gives none)."""
        ...

    async def grade(self, item: Item, answer: str) -> bool: ...

    def describe(self) -> dict[str, Any]:
        """What the report records of it."""
        ...


class NumericGrader:
    """Right when the last number of the answer equals the reference's (1,234 = 1234.0)."""

    name = "numeric"

    def key(self, answer: str) -> str | None:
        return number_key(answer)

    async def grade(self, item: Item, answer: str) -> bool:
        expected = number_key(item.reference)
        if expected is None:
            raise ConfigError(f"item {item.id}: its reference {item.reference[:80]!r} holds no "
                              "number: grade this dataset with another grader")
        return self.key(answer) == expected

    def describe(self) -> dict[str, Any]:
        return {"grader": self.name}


def _plain(text: str) -> str:
    """Compared loosely: case, surrounding spaces and quotes, a final full stop ignored."""
    return " ".join(text.split()).strip("\"'` ").removesuffix(".").casefold()


class ExactGrader:
    """Right when the answer is the reference, case, spacing and a final full stop aside."""

    name = "exact"

    def key(self, answer: str) -> str | None:
        return _plain(answer) or None

    async def grade(self, item: Item, answer: str) -> bool:
        return self.key(answer) == _plain(item.reference)

    def describe(self) -> dict[str, Any]:
        return {"grader": self.name}


class RegexGrader:
    """Right when the last match of ``pattern`` in the answer (its first group, if it has one)
    is the reference, compared as ``ExactGrader`` does."""

    name = "regex"

    def __init__(self, pattern: str) -> None:
        try:
            self.pattern = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"bad grader regex {pattern!r}: {exc}") from exc

    def key(self, answer: str) -> str | None:
        matches = list(self.pattern.finditer(answer))
        if not matches:
            return None
        last = matches[-1]
        return _plain(last.group(1) if self.pattern.groups else last.group(0)) or None

    async def grade(self, item: Item, answer: str) -> bool:
        return self.key(answer) == _plain(item.reference)

    def describe(self) -> dict[str, Any]:
        return {"grader": self.name, "pattern": self.pattern.pattern}


class Grading(BaseModel):
    """Whether the answer says what the reference says."""

    correct: bool
    reason: str = Field(default="", max_length=300)


JUDGE_SYSTEM = ("You grade answers. Given a question, a reference answer and a candidate answer, "
                "decide whether the candidate reaches the same final answer as the reference. "
                "Ignore wording, style and reasoning.")


class JudgeGrader:
    """A model decides whether free text says what the reference says. Its calls are the
    grader's, not an arm's: they are in no arm's calls or tokens. Votes count samples by their
    text compared loosely (``ExactGrader``'s key)."""

    name = "judge"

    def __init__(self, llm: LLM, *, system: str = JUDGE_SYSTEM) -> None:
        self.llm = llm
        self.system = system

    def key(self, answer: str) -> str | None:
        return _plain(answer) or None

    async def grade(self, item: Item, answer: str) -> bool:
        prompt = (f"Question: {item.question}\n\nReference answer: {item.reference}\n\n"
                  f"Candidate answer: {answer}\n\nIs the candidate answer correct?")
        request = LLMRequest(self.system, (Message("user", prompt),), Grading,
                             speaker="grader", purpose="grade")
        response = await self.llm.complete(request)
        try:
            grading = Grading.model_validate(
                response.structured.model_dump() if response.structured is not None
                else parse_structured(response.text, Grading).model_dump())
        except (InvalidStructuredOutput, ValidationError) as exc:
            raise LLMResponseError(f"the judge grader {model_name(self.llm)!r} did not grade "
                                   f"item {item.id}: {response.text[:120]!r}") from exc
        return grading.correct

    def describe(self) -> dict[str, Any]:
        return {"grader": self.name, "model": model_name(self.llm), "system": self.system}
