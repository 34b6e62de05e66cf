"""Forks: a new debate from a stored debate's first K committed rounds, with changes. It calls no
model for rounds 1…K, makes the right calls after, records its parent and fork point, and leaves
the parent's result as it was."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from debatebus import Debate, Judge, Participant
from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.engine._definition import FailurePolicy
from debatebus.exceptions import ConfigError
from debatebus.handlers._checkpointing import debate_key
from debatebus.handlers._forks import changed, fork
from debatebus.llm import LLMRequest
from debatebus.testing import FunctionLLM

QUESTION = "Rewrite the billing service in Rust?"


class Model:
    """A FunctionLLM that counts its calls by (purpose, round, speaker)."""

    def __init__(self, name: str, *, fail_round: int | None = None) -> None:
        self.name, self.fail_round = name, fail_round
        self.calls: Counter[tuple[str, int, str]] = Counter()
        self.prompts: dict[tuple[str, int, str], str] = {}
        self.llm = FunctionLLM(self.answer)

    def answer(self, request: LLMRequest) -> Any:
        key = (request.purpose, request.round, request.speaker)
        self.calls[key] += 1
        self.prompts[key] = request.prompt
        if request.round == self.fail_round:
            raise RuntimeError(f"{self.name} is down")
        if request.purpose == "judge":
            return {"consensus": False, "summary": f"{self.name}: round {request.round}"}
        return f"{request.speaker} ({self.name}) in round {request.round}"


def four_rounds(llm: Any, policy: FailurePolicy = "degrade") -> Debate:
    return Debate("billing", [Participant("optimist", "For."), Participant("critic", "Against.")],
                  llm=llm, moderator=Participant("moderator", "Moderate."), judge=Judge(),
                  max_rounds=4, failure_policy=policy)


def texts(fields: dict[str, Any], number: int) -> list[str]:
    return [t["text"] for t in fields["debateTranscript"][number - 1]["turns"]]


async def test_a_fork_from_round_2_with_another_critic_pays_only_for_rounds_3_and_4():
    store, base = MemoryCheckpointStore(), Model("base")
    parent = four_rounds(base.llm)
    parent_fields = await parent.as_handler(store=store)({"input": QUESTION}, request_id="p1")
    stored = await store.get_result(debate_key("billing", "p1"))
    base.calls.clear()

    strong = Model("strong")
    forked = await fork(changed(parent, models={"critic": strong.llm}), store, "p1",
                        from_round=2, debate_id="f1")

    assert forked["debateStatus"] == "completed"
    assert forked["debateForkOf"] == {"debateId": "p1", "fromRound": 2}
    assert forked["debateResumedFromRound"] == 2
    assert forked["debateRounds"] == 4
    # Zero calls for the framing and rounds 1-2; after them, the critic on its new model.
    assert all(r > 2 for (_, r, _) in base.calls | strong.calls)
    assert base.calls == {("rebuttal", 3, "optimist"): 1, ("judge", 3, "judge"): 1,
                          ("rebuttal", 4, "optimist"): 1, ("judge", 4, "judge"): 1,
                          ("synthesis", 4, "moderator"): 1}
    assert strong.calls == {("rebuttal", 3, "critic"): 1, ("rebuttal", 4, "critic"): 1}
    # The fork carries on the parent's debate: the same first rounds, seen by the new model.
    assert forked["debateTranscript"][:2] == parent_fields["debateTranscript"][:2]
    assert "critic (base) in round 2" in strong.prompts["rebuttal", 3, "critic"]
    assert texts(forked, 3) == ["optimist (base) in round 3", "critic (strong) in round 3"]
    # It pays only for what came after round 2.
    own = forked["debateTokenUsage"]["totalTokens"]
    assert 0 < own < parent_fields["debateTokenUsage"]["totalTokens"]
    # The parent's stored result is unchanged, and the fork is stored under its own id.
    assert await store.get_result(debate_key("billing", "p1")) == stored
    again = await fork(changed(parent, models={"critic": strong.llm}), store, "p1",
                       from_round=2, debate_id="f1")
    assert again["debateReplayed"] is True
    assert strong.calls == {("rebuttal", 3, "critic"): 1, ("rebuttal", 4, "critic"): 1}


async def test_a_fork_from_the_checkpoint_of_a_debate_that_failed_in_round_3():
    store, flaky = MemoryCheckpointStore(), Model("flaky", fail_round=3)
    parent = four_rounds(flaky.llm, policy="strict")
    failed = await parent.as_handler(store=store)({"input": QUESTION}, request_id="p2")
    assert (failed["debateStatus"], failed["debateRetryable"]) == ("failed", True)
    assert await store.get_result(debate_key("billing", "p2")) is None  # only a checkpoint
    flaky.calls.clear()

    steady = Model("steady")
    forked = await fork(changed(parent, models={"optimist": steady.llm, "critic": steady.llm},
                                judge_llm=steady.llm), store, "p2", from_round=2)
    assert forked["debateStatus"] == "completed"
    assert forked["debateId"].startswith("p2~fork-")
    assert {r for (_, r, _) in flaky.calls | steady.calls} == {3, 4}  # none for rounds 1-2
    assert steady.calls[("rebuttal", 3, "critic")] == steady.calls[("judge", 4, "judge")] == 1


async def test_a_fork_adds_and_drops_participants_and_plays_more_rounds():
    store, base = MemoryCheckpointStore(), Model("base")
    parent = four_rounds(base.llm)
    await parent.as_handler(store=store)({"input": QUESTION}, request_id="p3")
    base.calls.clear()
    other = changed(parent, drop=["optimist"], add=[Participant("skeptic", "Doubt it.")],
                    max_rounds=5)
    forked = await fork(other, store, "p3", from_round=3)
    assert forked["debateRounds"] == 5
    assert [t["speaker"] for t in forked["debateTranscript"][2]["turns"]] == ["optimist",
                                                                             "critic"]
    assert [t["speaker"] for t in forked["debateTranscript"][4]["turns"]] == ["critic",
                                                                             "skeptic"]
    assert {(p, r, s) for (p, r, s) in base.calls if p == "rebuttal"} == {
        ("rebuttal", 4, "critic"), ("rebuttal", 4, "skeptic"),
        ("rebuttal", 5, "critic"), ("rebuttal", 5, "skeptic")}


async def test_a_fork_says_what_it_cannot_start_from():
    store, base = MemoryCheckpointStore(), Model("base")
    parent = four_rounds(base.llm)
    await parent.as_handler(store=store)({"input": QUESTION}, request_id="p4")
    with pytest.raises(ConfigError, match=r"committed rounds \[1, 2, 3, 4\]"):
        await fork(parent, store, "p4", from_round=5)
    with pytest.raises(ConfigError, match="no debate 'nope' in 'billing'"):
        await fork(parent, store, "nope", from_round=1)
    with pytest.raises(ConfigError, match="cannot drop"):
        changed(parent, drop=["nobody"])
    with pytest.raises(ConfigError, match="to give a model to"):
        changed(parent, models={"nobody": base.llm})
