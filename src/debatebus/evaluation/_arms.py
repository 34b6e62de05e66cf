"""The arms an evaluation compares, each answering every item its own way:

- ``Single``: one call.
- ``Vote``: self-consistency, the majority of k independent samples; k fixed, or matched to
  another arm's calls (or tokens) on the same item.
- ``DebateArm``: a ``Debate`` run in process (any protocol, judge, preset, or your own).
- ``HandlerArm``: a handler called in process, ``async handler(payload) -> result``.
- ``FleetArm``: a request published to a running fleet (``BusClient``), its result read back:
  the fleet's real handler is what is measured.

A debate's, handler's or fleet's answer is read from its result document (``debateOutput``,
``debateCalls``, ``debateTokenUsage``, ``debateCost.total`` when the fleet prices its calls)
by ``read_result``, the one reader of results.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import msgspec

from debatebus._pricing import Prices
from debatebus._redaction import redact
from debatebus._usage import ZERO_USAGE, TokenUsage
from debatebus.client import BusClient
from debatebus.engine._cross_pollination import ROUNDS as CROSS_POLLINATION_ROUNDS
from debatebus.engine._debate import Debate
from debatebus.engine._definition import Judge, Participant
from debatebus.engine._definition import Protocol as DebateProtocol
from debatebus.evaluation._graders import Grader
from debatebus.exceptions import ConfigError, LLMError
from debatebus.handlers._results import result_fields
from debatebus.llm._base import LLM, LLMRequest, Message, model_name

#: The system prompt of ``Single`` and ``Vote`` calls unless given another.
DEFAULT_SYSTEM = "You are a careful problem solver. Think step by step, then state your answer."

#: How a debate's final answer is read: its output (the synthesis, or the last round's lines),
#: or the majority of its participants' last-round answers (Du et al.).
FinalAnswer = Literal["output", "majority"]
#: What a vote matches on the arm it is matched to: its calls, or its total tokens.
Match = Literal["calls", "tokens"]
Handler = Callable[[dict[str, Any]], Awaitable[Mapping[str, Any]]]


@dataclass(frozen=True, slots=True)
class Answer:
    """What an arm answered one item with, and what it spent. ``calls`` and ``usage`` are None
    when a handler's result does not say; ``cost`` only when the result carries one."""

    text: str
    calls: int | None
    usage: TokenUsage | None
    cost: float | None = None
    failed: bool = False
    error: str | None = None
    #: A debate's rounds played, and whether its stop rule (judge, until) ended it.
    rounds: int | None = None
    satisfied: bool | None = None


@dataclass(frozen=True, slots=True)
class Ask:
    """One item as an arm is asked it."""

    #: What every arm is asked: the item's question and the dataset's instruction.
    question: str
    #: Unique to this evaluation, arm and item (a fleet's debate id is made from it).
    key: str
    grader: Grader
    #: The answer of the arm a vote is matched to, on this item (None for other arms).
    matched: Answer | None = None


class Arm(Protocol):
    """One way of answering. ``kind`` is ``single``, ``vote``, ``debate``, ``handler`` or
    ``fleet``; the first ``single`` and ``vote`` arms are the baselines the others are tested
    against. ``matched_to``: the name of the arm whose answer ``Ask.matched`` carries."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def matched_to(self) -> str | None: ...

    def describe(self) -> dict[str, Any]:
        """What the report records of it: models, settings (a stable, JSON-ready document)."""

    async def answer(self, ask: Ask) -> Answer: ...


def _request(system: str, question: str, purpose: str, number: int,
             max_tokens: int | None) -> LLMRequest:
    return LLMRequest(system, (Message("user", question),), None, max_tokens, purpose, purpose,
                      number)


def _priced(prices: Prices | None, llm: LLM, usage: TokenUsage | None) -> float | None:
    """What ``usage`` of ``llm`` cost at ``prices``; None when unknown (no price: never a guess)."""
    if prices is None or usage is None:
        return None
    return prices.cost(model_name(llm), usage)


class Single:
    """One call to ``llm``; its text is the answer. With ``prices``, its cost too."""

    kind = "single"
    matched_to = None

    def __init__(self, llm: LLM, *, name: str = "single", system: str = DEFAULT_SYSTEM,
                 max_tokens: int | None = None, prices: Prices | None = None) -> None:
        self.llm, self.name, self.system, self.max_tokens = llm, name, system, max_tokens
        self.prices = prices

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": model_name(self.llm), "system": self.system,
                "maxTokens": self.max_tokens}

    async def answer(self, ask: Ask) -> Answer:
        request = _request(self.system, ask.question, "single", 0, self.max_tokens)
        try:
            response = await self.llm.complete(request)
        except LLMError as exc:
            return Answer("", 1, exc.usage, _priced(self.prices, self.llm, exc.usage),
                          failed=True, error=redact(str(exc)))
        return Answer(response.text, 1, response.usage or ZERO_USAGE,
                      _priced(self.prices, self.llm, response.usage))


class Vote:
    """Self-consistency: ``k`` independent samples of one call each, and the answer most of them
    give (by the grader's key; a tie goes to the value sampled first). Either ``k`` is fixed, or
    the vote is matched to arm ``matched_to`` on each item: as many samples as its calls, or
    (``match="tokens"``) samples until its total tokens are reached, so the vote overshoots by
    less than one sample (a sample whose tokens are unknown ends it). A sample whose call fails
    counts, and has no vote. With ``prices``, its cost too."""

    kind = "vote"

    def __init__(self, llm: LLM, *, k: int | None = None, matched_to: str | None = None,
                 match: Match = "calls", name: str = "vote", system: str = DEFAULT_SYSTEM,
                 max_tokens: int | None = None, prices: Prices | None = None) -> None:
        if (k is None) == (matched_to is None):
            raise ConfigError("Vote needs either k= (a fixed number of samples) or matched_to= "
                              "(the arm whose calls or tokens it matches), not both or neither")
        if k is not None and k < 1:
            raise ConfigError(f"Vote needs k ≥ 1 samples, got {k}")
        if match not in ("calls", "tokens"):
            raise ConfigError(f"Vote matches 'calls' or 'tokens', not {match!r}")
        self.llm, self.k, self.matched_to, self.match = llm, k, matched_to, match
        self.name, self.system, self.max_tokens = name, system, max_tokens
        self.prices = prices

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": model_name(self.llm), "system": self.system,
                "k": self.k, "matchedTo": self.matched_to,
                "match": self.match if self.matched_to else None, "maxTokens": self.max_tokens}

    def _more(self, ask: Ask, samples: int, spent: TokenUsage) -> bool:
        """Whether to draw another sample, after ``samples`` that spent ``spent``."""
        if self.k is not None:
            return samples < self.k
        target = ask.matched
        if target is None:
            raise ConfigError(f"vote {self.name!r} is matched to {self.matched_to!r}, "
                              "which gave it no answer")
        if self.match == "calls":
            if target.calls is None:
                raise ConfigError(_unknown(self.matched_to, "calls", "debateCalls"))
            return samples < max(target.calls, 1)
        if target.usage is None:
            raise ConfigError(_unknown(self.matched_to, "tokens", "debateTokenUsage"))
        return samples == 0 or spent.total_tokens < target.usage.total_tokens

    async def answer(self, ask: Ask) -> Answer:
        texts: list[str] = []
        errors: list[str] = []
        spent, samples, blind = ZERO_USAGE, 0, False
        while not blind and self._more(ask, samples, spent):
            samples += 1
            request = _request(self.system, ask.question, "sample", samples, self.max_tokens)
            usage: TokenUsage | None
            try:
                response = await self.llm.complete(request)
                usage = response.usage
                texts.append(response.text)
            except LLMError as exc:
                usage = exc.usage
                errors.append(redact(str(exc)))
            spent += usage or ZERO_USAGE
            # Matching tokens, a sample of unknown cost leaves nothing to count on: it ends the vote.
            blind = self.k is None and self.match == "tokens" and not (usage and usage.total_tokens)
        cost = _priced(self.prices, self.llm, spent)
        if not texts:
            return Answer("", samples, spent, cost, failed=True,
                          error=errors[0] if errors else None)
        return Answer(majority(texts, ask.grader), samples, spent, cost)


def _unknown(arm: str | None, what: str, field: str) -> str:
    return (f"the vote is matched to the {what} of arm {arm!r}, whose results do not say them "
            f"(no {field}): match on the other measure, or give the vote a fixed k")


def majority(texts: Sequence[str], grader: Grader) -> str:
    """The first of ``texts`` giving the value most of them give (by ``grader.key``; a tie goes
    to the value given first); the first text when none gives a value."""
    keys = [grader.key(text) for text in texts]
    counts = Counter(key for key in keys if key is not None)
    if not counts:
        return texts[0] if texts else ""
    winner = counts.most_common(1)[0][0]
    return texts[keys.index(winner)]


# --- debates, handlers and fleets: read from their result documents -----------------------------


class _TurnView(msgspec.Struct):
    text: str = ""
    failed: bool = False


class _RoundView(msgspec.Struct):
    turns: list[_TurnView] = []


class _CostView(msgspec.Struct):
    total: float | None = None


class _ResultView(msgspec.Struct, rename="camel"):
    """The fields of a result document an evaluation reads."""

    debate_output: str
    debate_status: str = "completed"
    debate_error: str | None = None
    debate_calls: int | None = None
    debate_token_usage: TokenUsage | None = None
    debate_total_token_usage: TokenUsage | None = None
    debate_cost: _CostView | None = None
    debate_rounds: int | None = None
    debate_satisfied: bool | None = None
    debate_transcript: list[_RoundView] = []


def read_result(fields: Mapping[str, Any], grader: Grader, final: FinalAnswer = "output") -> Answer:
    """An answer from a result document: its output, or (``final="majority"``) the majority of
    the last round's turns; its calls, tokens (sub-debates' included) and ``debateCost.total``."""
    try:
        view = msgspec.convert(dict(fields), _ResultView)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"a result document an evaluation cannot read ({exc}): a handler must "
                          "return debatebus's result fields, at least debateOutput") from exc
    text = view.debate_output
    if final == "majority" and view.debate_transcript:
        said = [t.text for t in view.debate_transcript[-1].turns if not t.failed]
        text = majority(said, grader) if said else text
    failed = view.debate_status != "completed"
    return Answer(text, view.debate_calls,
                  view.debate_total_token_usage or view.debate_token_usage,
                  view.debate_cost.total if view.debate_cost else None,
                  failed, view.debate_error if failed else None,
                  view.debate_rounds, view.debate_satisfied)


def _final(final: FinalAnswer) -> FinalAnswer:
    if final not in ("output", "majority"):
        raise ConfigError(f"a debate's final answer is 'output' or 'majority', not {final!r}")
    return final


#: The persona of every participant of ``solver_debate``.
SOLVER_PERSONA = ("You solve the question with the other participants: check their reasoning, "
                  "correct any mistake, and end with your final answer.")


def solver_debate(llm: LLM, *, protocol: DebateProtocol = "round-robin", agents: int = 3,
                  rounds: int = 2, judge: bool = False,
                  word_limits: Mapping[str, int] | None = None) -> Debate:
    """``agents`` equal solvers on ``llm`` in ``protocol`` for ``rounds`` rounds (cross-pollination
    always plays 2), with a judge that may stop a round-robin early: the built-in debate arms of
    ``debatebus eval`` (``round-robin:3x2``, ``cross-pollination:3+judge``…). ``word_limits``:
    per phase, over the protocol's own (``Debate``'s argument)."""
    if protocol == "cross-pollination" and rounds != CROSS_POLLINATION_ROUNDS:
        raise ConfigError(f"cross-pollination always plays {CROSS_POLLINATION_ROUNDS} rounds "
                          f"(positions, then revisions), not {rounds}")
    participants = [Participant(f"solver-{i}", SOLVER_PERSONA) for i in range(1, agents + 1)]
    return Debate(f"{protocol}-{agents}x{rounds}{'-judge' if judge else ''}", participants,
                  llm=llm, protocol=protocol, max_rounds=rounds,
                  judge=Judge() if judge else None, word_limits=word_limits)


class DebateArm:
    """``debate`` run in process on each item; its answer is read as ``final`` says."""

    kind = "debate"
    matched_to = None

    def __init__(self, debate: Debate, *, name: str | None = None,
                 final: FinalAnswer = "output") -> None:
        self.debate, self.name, self.final = debate, name or debate.name, _final(final)

    def describe(self) -> dict[str, Any]:
        spec = self.debate.spec
        models = sorted({model_name(spec.llm_for(p)) for p in spec.participants})
        return {"kind": self.kind, "debate": spec.name, "protocol": spec.protocol,
                "participants": len(spec.participants), "maxRounds": spec.max_rounds,
                "minRounds": spec.min_rounds, "judge": spec.judge is not None,
                "models": models, "final": self.final, "definition": self.debate.definition_hash}

    async def answer(self, ask: Ask) -> Answer:
        result = await self.debate.run(ask.question)
        return read_result(result_fields(result), ask.grader, self.final)


class HandlerArm:
    """``handler({"input": question})`` called in process (``Debate.as_handler()``, or your own
    that returns debatebus's result fields)."""

    kind = "handler"
    matched_to = None

    def __init__(self, handler: Handler, *, name: str, final: FinalAnswer = "output") -> None:
        self.handler, self.name, self.final = handler, name, _final(final)

    def describe(self) -> dict[str, Any]:
        handler = self.handler
        where = getattr(handler, "__qualname__", type(handler).__qualname__)
        return {"kind": self.kind, "handler": f"{handler.__module__}.{where}",
                "final": self.final}

    async def answer(self, ask: Ask) -> Answer:
        return read_result(await self.handler({"input": ask.question}), ask.grader, self.final)


class FleetArm:
    """Each item published as a request on ``event_type`` through ``client`` (connected by the
    caller), its result read back. The request's ``debateId`` is the ask's key: a fleet with a
    store answers a resumed evaluation's repeated request from the store instead of paying again.
    The fleet's own rate limits apply to it."""

    kind = "fleet"
    matched_to = None

    def __init__(self, client: BusClient, *, event_type: str = "debate:request",
                 name: str = "fleet", final: FinalAnswer = "output",
                 timeout: float = 600.0) -> None:
        self.client, self.event_type, self.name = client, event_type, name
        self.final, self.timeout = _final(final), timeout

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "eventType": self.event_type, "final": self.final}

    async def answer(self, ask: Ask) -> Answer:
        envelope = await self.client.request(
            self.event_type, {"input": ask.question, "debateId": ask.key},
            timeout=self.timeout)
        return read_result(envelope.payload, ask.grader, self.final)
