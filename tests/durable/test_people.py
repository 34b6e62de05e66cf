"""A person in a durable debate on the bus: the turn's record is committed (with the turns before
it) before its request is published; a debate resumed after a crash waits for that same turn,
takes a reply sent while nobody listened from the broker's history, and calls no model of that
round again; only a reply to the very request published answers; a missed deadline degrades
(strict: fails the debate)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from tests.support.bus import memory_app, running

from debatebus import Debate, Participant
from debatebus.checkpoints import MemoryCheckpointStore
from debatebus.client import Answers, BusClient
from debatebus.engine import HumanParticipant
from debatebus.handlers._checkpointing import debate_key
from debatebus.handlers._contract import HandlerContext, HandlerResult
from debatebus.handlers._people import turn_reply
from debatebus.llm import LLMRequest
from debatebus.schemas.envelope import ENVELOPE_DECODER, Envelope, failed_topic
from debatebus.testing import FunctionLLM
from debatebus.transports import Delivery, Outgoing
from debatebus.transports._memory import MemoryBroker, MemoryTransport

QUESTION = "Ship the redesign on Friday?"
ALICE_SAYS = "alice: ship it behind a flag"


@pytest.fixture
async def setups() -> AsyncIterator[list[Setup]]:
    """Each test's setups, their workers stopped at the end whatever happened."""
    made: list[Setup] = []
    yield made
    for setup in made:
        await setup.close()


class Setup:
    def __init__(self, *, deadline_s: float = 30.0, policy: str = "degrade") -> None:
        self.store = MemoryCheckpointStore()
        self.transport = MemoryTransport(MemoryBroker())
        self.answers: list[Answers] = []  # each worker's own
        tag = uuid.uuid4().hex[:8]
        self.debate_type, self.alice_type = f"debate:{tag}", f"debate:turn:alice:{tag}"
        self.deadline_s, self.policy = deadline_s, policy
        self.calls: Counter[tuple[str, int]] = Counter()
        self.prompts: dict[tuple[str, int], str] = {}
        self.tasks: list[asyncio.Task[HandlerResult]] = []

    def answer(self, request: LLMRequest) -> str:
        self.calls[request.speaker, request.round] += 1
        self.prompts[request.speaker, request.round] = request.prompt
        return f"{request.speaker} in round {request.round}"

    def debate(self) -> Debate:
        alice = HumanParticipant("alice", event_type=self.alice_type, deadline_s=self.deadline_s)
        return Debate("people", [Participant("optimist", "For."), alice,
                                 Participant("critic", "Against.")],
                      llm=FunctionLLM(self.answer), max_rounds=2,
                      failure_policy=self.policy)  # type: ignore[arg-type]

    def worker(self) -> asyncio.Task[HandlerResult]:
        """The debate's request handled by a new worker (a new handler and its own waits for
        replies, on the shared store and broker)."""
        self.answers.append(Answers(self.transport))
        ctx = HandlerContext("d1", None, Delivery(self.debate_type, b"", "1-0"), self.transport,
                             answers=self.answers[-1])
        handler = self.debate().as_handler(store=self.store)
        self.tasks.append(asyncio.create_task(handler.handle({"input": QUESTION}, ctx)))
        return self.tasks[-1]

    async def requests_sent(self) -> Counter[str]:
        """How many turn requests were published, by turn key."""
        return Counter([ENVELOPE_DECODER.decode(d.body).request_id
                        async for d in self.transport.read_range(self.alice_type)])

    async def close(self) -> None:
        for task in self.tasks:
            await killed(task)
        for answers in self.answers:
            await answers.close()

    async def reply(self, request: Envelope, text: str) -> None:
        assert request.message_id is not None
        await self.transport.publish(turn_reply(self.alice_type, request.request_id,
                                                request.message_id, text))


async def next_request(requests: AsyncIterator[Delivery], timeout: float = 10.0) -> Envelope:
    async with asyncio.timeout(timeout):
        return ENVELOPE_DECODER.decode((await anext(requests)).body)


async def killed(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def alice_turns(result: HandlerResult) -> list[dict[str, Any]]:
    return [t for r in result.fields["debateTranscript"] for t in r["turns"]
            if t["speaker"] == "alice"]


async def test_a_persons_turn_is_a_request_answered_by_a_reply(setups: list[Setup]):
    setup = Setup()
    setups.append(setup)
    requests = await setup.transport.subscribe([setup.alice_type])
    running = setup.worker()
    first = await next_request(requests)
    payload = first.payload
    assert first.request_id == payload["turnKey"] == "d1~turn-1-alice-1"
    assert (payload["debateId"], payload["speaker"], payload["round"], payload["phase"]) == (
        "d1", "alice", 1, "opening")
    assert "optimist in round 1" in payload["transcript"]  # what was said before her turn
    assert payload["prompt"].startswith(f"Debate topic: {QUESTION}")
    assert payload["deadline"].endswith("Z")
    # Her record, and the optimist's turn before it, were committed before the request went out.
    checkpoint = await setup.store.load(debate_key(setup.debate_type, "d1"))
    assert checkpoint is not None
    tail = [msgspec.json.decode(e) for e in checkpoint.entries[-2:]]
    assert [e["type"] for e in tail] == ["turn", "person"]
    assert tail[0]["turn"]["speaker"] == "optimist"
    assert (tail[1]["person"]["key"], tail[1]["person"]["message_id"]) == (
        first.request_id, first.message_id)

    await setup.reply(first, ALICE_SAYS)
    await setup.reply(await next_request(requests), "alice again")  # round 2
    result = await asyncio.wait_for(running, 10)

    assert result.status == "completed"
    assert [t["text"] for t in alice_turns(result)] == [ALICE_SAYS, "alice again"]
    assert ALICE_SAYS in setup.prompts["critic", 1]  # the others hear her
    assert set(setup.calls.values()) == {1}


async def test_a_resumed_debate_takes_the_reply_sent_while_no_worker_listened(setups: list[Setup]):
    setup = Setup()
    setups.append(setup)
    requests = await setup.transport.subscribe([setup.alice_type])
    first_worker = setup.worker()
    first = await next_request(requests)
    await killed(first_worker)  # the worker dies while she types
    await setup.answers[0].close()  # and stops listening
    await setup.reply(first, ALICE_SAYS)  # answered while no worker listens

    resumed = setup.worker()
    second = await next_request(requests)  # the next request is round 2's: round 1's was not sent again
    assert second.request_id == "d1~turn-2-alice-1"
    await setup.reply(second, "alice again")
    result = await asyncio.wait_for(resumed, 10)

    assert result.status == "completed"
    assert [t["text"] for t in alice_turns(result)] == [ALICE_SAYS, "alice again"]  # used once
    assert set(setup.calls.values()) == {1}, setup.calls  # no model call repeated
    assert await setup.requests_sent() == {first.request_id: 1, second.request_id: 1}


async def test_a_resumed_debate_waits_for_the_same_turn(setups: list[Setup]):
    setup = Setup()
    setups.append(setup)
    requests = await setup.transport.subscribe([setup.alice_type])
    first_worker = setup.worker()
    first = await next_request(requests)
    await killed(first_worker)
    await setup.answers[0].close()

    resumed = setup.worker()
    await setup.reply(first, ALICE_SAYS)  # while the resumed worker listens
    second = await next_request(requests)
    assert second.request_id == "d1~turn-2-alice-1"
    await setup.reply(second, "alice again")
    result = await asyncio.wait_for(resumed, 10)
    assert [t["text"] for t in alice_turns(result)] == [ALICE_SAYS, "alice again"]
    assert set(setup.calls.values()) == {1}
    # It waited for the committed turn: one request per turn, none sent again.
    assert await setup.requests_sent() == {first.request_id: 1, second.request_id: 1}


async def test_only_a_reply_to_the_request_published_answers_the_turn(setups: list[Setup]):
    setup = Setup()
    setups.append(setup)
    requests = await setup.transport.subscribe([setup.alice_type])
    running = setup.worker()
    first = await next_request(requests)
    # Planted under the turn's predictable key, but caused by another message: passed over.
    await setup.transport.publish(turn_reply(setup.alice_type, first.request_id, "f" * 32,
                                             "not hers"))
    await setup.reply(first, ALICE_SAYS)
    await setup.reply(await next_request(requests), "alice again")
    result = await asyncio.wait_for(running, 10)
    assert [t["text"] for t in alice_turns(result)] == [ALICE_SAYS, "alice again"]


async def test_a_declined_turn_fails_and_the_debate_goes_on(setups: list[Setup]):
    setup = Setup()
    setups.append(setup)
    requests = await setup.transport.subscribe([setup.alice_type])
    running = setup.worker()
    first = await next_request(requests)
    assert first.message_id is not None
    declined = ENVELOPE_DECODER.decode(turn_reply(setup.alice_type, first.request_id,
                                                  first.message_id, "-").body)
    declined.payload = {"debateStatus": "failed", "debateError": "away from keyboard"}
    await setup.transport.publish(Outgoing(failed_topic(setup.alice_type),
                                           msgspec.json.encode(declined)))
    await setup.reply(await next_request(requests), "alice again")
    result = await asyncio.wait_for(running, 10)

    assert result.status == "completed"
    declined_turn, answered = alice_turns(result)
    assert declined_turn["failed"] and "away from keyboard" in declined_turn["error"]
    assert answered["text"] == "alice again"


async def test_a_missed_deadline_skips_the_turn(setups: list[Setup]):
    setup = Setup(deadline_s=0.2)
    setups.append(setup)
    result = await asyncio.wait_for(setup.worker(), 10)  # nobody answers
    assert result.status == "completed"
    turns = alice_turns(result)
    assert [t["failed"] for t in turns] == [True, True]
    assert "did not answer within the deadline of 0.2 s" in turns[0]["error"]
    assert setup.calls["critic", 2] == 1  # the others went on


async def test_a_missed_deadline_fails_a_strict_debate_for_good(setups: list[Setup]):
    setup = Setup(deadline_s=0.2, policy="strict")
    setups.append(setup)
    result = await asyncio.wait_for(setup.worker(), 10)
    assert result.status == "failed"
    assert "person 'alice' failed in round 1" in result.fields["debateError"]
    assert result.fields["debateRetryable"] is False
    assert ("critic", 1) not in setup.calls


async def test_a_worker_at_concurrency_1_serves_the_person_its_debate_waits_for():
    """The wait lends the worker's only slot: the agent answering the turn runs on that worker."""
    setup = Setup()
    app = memory_app(concurrency=1, publish_events=False)

    async def alice(payload: dict[str, Any]) -> dict[str, Any]:
        return {"text": f"alice in round {payload['round']}"}

    app.subscribe(setup.debate_type, setup.debate().as_handler())
    app.subscribe(setup.alice_type, alice)
    async with running(app), BusClient(MemoryTransport(app.transport.broker)) as client:
        result = await client.request(setup.debate_type, {"input": QUESTION}, timeout=10)
    assert result.payload["debateStatus"] == "completed"
    texts = [t["text"] for r in result.payload["debateTranscript"] for t in r["turns"]]
    assert texts == ["optimist in round 1", "alice in round 1", "critic in round 1",
                     "optimist in round 2", "alice in round 2", "critic in round 2"]
