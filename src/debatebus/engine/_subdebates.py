"""Sub-debates: a participant asks, in cross-pollination round 1b, for a specialist panel's view.

The engine decides *whether* a child runs (trigger, domains, depth and per-debate caps), emits the
``sub_debate_*`` events, bounds the wait and degrades on any failure; *how* a child runs is a
``ChildRunner`` injected into the run: ``InProcessChildren`` runs the child ``Debate`` here (what
``Debate.run()`` does by default); on a bus, the handler injects one that publishes a child request
and waits for its result. The protocol code does not know which.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, Union

import msgspec

from debatebus._usage import ZERO_USAGE, TokenUsage
from debatebus.engine._definition import Participant
from debatebus.engine._run import Run
from debatebus.engine._transcript import Turn
from debatebus.exceptions import ConfigError
from debatebus.schemas import events as ev
from debatebus.schemas.cost import DebateCost

if TYPE_CHECKING:
    from debatebus.engine._debate import Debate
    from debatebus.engine._result import Progress

MARKER = "REQUEST_SUB_DEBATE:"
_MARKER_LINE = re.compile(r"[ \t>*_`-]*REQUEST_SUB_DEBATE:[ \t]*(?P<domain>.*?)[ \t*_`]*")

#: A domain's panel: a ``Debate``, participants in a list or tuple (run as a cross-pollination
#: panel on the parent's llm), or an event type (a string) a bus worker serves.
Target = Union["Debate", list[Participant], tuple[Participant, ...], str]
ChildStatus = Literal["running", "completed", "failed"]


class TriggerResult(msgspec.Struct, frozen=True):
    """What a trigger found in a 1b position: the text without markers, and the domains asked for
    in order (empty: none)."""

    text: str
    domains: tuple[str, ...] = ()


Trigger = Callable[[str], TriggerResult]


def parse_marker(text: str) -> TriggerResult:
    """The default trigger: every line ``REQUEST_SUB_DEBATE: <domain>`` (markdown decoration
    around it tolerated), removed from the text."""
    if MARKER not in text:
        return TriggerResult(text)
    kept, domains = [], []
    for line in text.splitlines():
        found = _MARKER_LINE.fullmatch(line)
        if found is None:
            kept.append(line)
        else:
            domains.append(found.group("domain"))
    return TriggerResult("\n".join(kept).strip(), tuple(domains))


@dataclass(frozen=True, slots=True)
class SubDebates:
    """``Debate(sub_debates=SubDebates(...))``: the domains a participant may ask a panel of,
    how deep children may nest (a run at depth d may ask when d < ``max_depth``), how many children
    one debate may start, how long the parent waits for one, and the marker parser."""

    domains: Mapping[str, Target]
    max_depth: int = 1
    max_per_debate: int = 1
    deadline_s: float = 600.0
    trigger: Trigger = parse_marker

    def __post_init__(self) -> None:
        if not self.domains or not all(isinstance(d, str) and d for d in self.domains):
            raise ConfigError("SubDebates needs domains: a mapping of domain names to a Debate, "
                              'participants or an event type, e.g. {"security": security_debate}')
        for name, value in (("max_depth", self.max_depth),
                            ("max_per_debate", self.max_per_debate)):
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"SubDebates {name} must be an integer ≥ 0, got {value!r}")
        if not self.deadline_s > 0:
            raise ConfigError(f"SubDebates deadline_s must be > 0 seconds, got {self.deadline_s!r}")
        object.__setattr__(self, "domains", dict(self.domains))

    def allows(self, depth: int) -> bool:
        """Whether a run at ``depth`` may start children at all."""
        return depth < self.max_depth and self.max_per_debate > 0


class SubDebateRecord(msgspec.Struct, kw_only=True):
    """One child of a debate: kept in its progress (and checkpoint), listed in its result."""

    domain: str
    child_id: str
    requested_by: str
    status: ChildStatus = "running"
    synthesis: str | None = None
    usage: TokenUsage = ZERO_USAGE
    error: str | None = None
    #: The ``messageId`` of the child's request, where a bus published it (committed before it is
    #: published): only a result caused by that very message answers the child.
    message_id: str | None = None
    #: What the child cost, its own children included, when its prices were known.
    cost: DebateCost | None = None


@dataclass(frozen=True, slots=True)
class ChildRequest:
    """What a ``ChildRunner`` runs: ``question`` under ``child_id`` at ``depth``, for ``domain``'s
    ``target``. ``parent_progress`` is the parent's live progress (a bus runner checkpoints the
    child's id with its counters)."""

    domain: str
    target: Target
    child_id: str
    question: str
    depth: int
    parent_id: str
    requested_by: str
    parent_progress: Progress


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    status: Literal["completed", "failed"]
    synthesis: str | None = None
    #: The child's whole usage, its own children's included.
    usage: TokenUsage = ZERO_USAGE
    error: str | None = None
    #: The child's whole cost, when known (its result's ``cost``, ``debateCost`` on a bus).
    cost: DebateCost | None = None


class ChildRunner(Protocol):
    async def __call__(self, request: ChildRequest) -> ChildOutcome: ...


def child_request_id(parent_id: str, domain: str, sequence: int) -> str:
    """A child's request (and debate) id: the parent's id, the domain and the child's number."""
    return f"{parent_id}~sub-{domain}-{sequence}"


def participants_of(target: Target) -> list[str]:
    """The names of a target's panel; empty for an event type (its worker decides)."""
    if isinstance(target, str):
        return []
    if isinstance(target, list | tuple):
        return [p.name for p in target]
    return [p.name for p in target.participants]


@dataclass(slots=True)
class InProcessChildren:
    """Runs each child here: a ``Debate`` target as it is, a panel as a cross-pollination debate on
    ``llm``; an event type needs a bus, so its child fails (and the parent degrades)."""

    parent: Debate
    on_event: Callable[[ev.DebateEvent], Awaitable[None] | None] | None = None
    panels: dict[str, Debate] = field(default_factory=dict)

    async def __call__(self, request: ChildRequest) -> ChildOutcome:
        target = request.target
        if isinstance(target, str):
            return ChildOutcome("failed", error=f"domain {request.domain!r} is served on the bus "
                                f"({target!r}): run the parent on a bus to reach it")
        debate = self._panel(request.domain, target) if isinstance(target, list | tuple) else target
        result = await debate.run(request.question, debate_id=request.child_id,
                                  on_event=self.on_event, depth=request.depth,
                                  request_id=request.child_id)
        if not result.ok:
            return ChildOutcome("failed", usage=result.total_usage, error=result.error,
                                cost=result.cost)
        return ChildOutcome("completed", result.synthesis or result.output, result.total_usage,
                            cost=result.cost)

    def _panel(self, domain: str, panel: Sequence[Participant]) -> Debate:
        debate = self.panels.get(domain)
        if debate is None:
            parent = self.parent
            debate = type(parent)(f"{parent.name}/{domain}", list(panel), llm=parent.llm,
                                  protocol="cross-pollination", language=parent.language,
                                  sub_debates=parent.sub_debates, prices=parent.prices)
            self.panels[domain] = debate
        return debate


Reissue = Callable[[str], Awaitable[Turn]]


class SubDebateSession:
    """One run's sub-debates: caps, events, the bounded wait, and what the requester says after.
    Its records live in the run's progress, so a resumed run reuses its children's ids."""

    def __init__(self, run: Run, config: SubDebates, runner: ChildRunner, depth: int) -> None:
        self.run = run
        self.config = config
        self.runner = runner
        self.depth = depth

    @property
    def offer(self) -> str:
        """The sentence the 1b prompt gets (``{sub_debates}``): empty when this run may not ask."""
        if not self.config.allows(self.depth):
            return ""
        return self.run.spec.lang.sub_debate_offer.format(domains=", ".join(self.config.domains))

    async def answer(self, who: Participant, turn: Turn, reissue: Reissue) -> Turn:
        """``turn`` without markers; when it asked for an allowed domain, the requester's position
        re-issued with the child's synthesis (or kept, stripped, if the child fails)."""
        if turn.failed:
            return turn
        found = self.config.trigger(turn.text)
        if not found.domains:
            return turn
        stripped = msgspec.structs.replace(turn, text=found.text)
        first, *extra = found.domains
        record = await self._open(who.name, first, found.text)
        for domain in extra:
            await self._skip(who.name, domain, "one sub-debate per position: marker ignored")
        if record is None or record.status == "failed":
            return stripped
        if record.status == "running":
            await self._wait(record, found.text)
        if record.status != "completed":
            return stripped
        lang = self.run.spec.lang
        again = await reissue(lang.sub_debate_feedback.format(domain=record.domain,
                                                              synthesis=record.synthesis or ""))
        if again.failed:
            return stripped
        return msgspec.structs.replace(again, text=self.config.trigger(again.text).text,
                                       usage=turn.usage + again.usage)

    async def _open(self, who: str, domain: str, position: str) -> SubDebateRecord | None:
        """The record of ``who``'s child for ``domain``: one committed before (resume), a new one,
        or None when a cap or an unknown domain refuses it (said in an event)."""
        records = self.run.progress.sub_debates
        known = next((r for r in records if r.requested_by == who and r.domain == domain), None)
        if known is not None:
            return known
        why = self._refusal(domain)
        if why is not None:
            await self._skip(who, domain, why)
            return None
        child_id = child_request_id(self.run.debate_id, domain, len(records) + 1)
        record = SubDebateRecord(domain=domain, child_id=child_id, requested_by=who)
        records.append(record)
        return record

    def _refusal(self, domain: str) -> str | None:
        config = self.config
        if domain not in config.domains:
            return f"unknown domain: use one of {sorted(config.domains)}"
        if not config.allows(self.depth):
            return f"max_depth {config.max_depth} reached at depth {self.depth}"
        if len(self.run.progress.sub_debates) >= config.max_per_debate:
            return f"max_per_debate {config.max_per_debate} reached"
        return None

    async def _skip(self, who: str, domain: str, reason: str) -> None:
        await self.run.emit(ev.SubDebateSkipped, domain=domain, requested_by=who, reason=reason)

    async def _wait(self, record: SubDebateRecord, position: str) -> None:
        """Run ``record``'s child within the deadline; any failure is recorded, never raised."""
        run, target = self.run, self.config.domains[record.domain]
        said = {"domain": record.domain, "requested_by": record.requested_by,
                "child_request_id": record.child_id}
        await run.emit(ev.SubDebateStarted, **said, participants=participants_of(target),
                       child_depth=self.depth + 1)
        request = ChildRequest(
            record.domain, target, record.child_id,
            run.spec.lang.sub_debate_question.format(question=run.question,
                                                     speaker=record.requested_by,
                                                     position=position),
            self.depth + 1, run.debate_id, record.requested_by, run.progress)
        try:
            async with asyncio.timeout(self.config.deadline_s):
                outcome = await self.runner(request)
        except TimeoutError:
            outcome = ChildOutcome("failed", error=f"no result within the sub-debate deadline of "
                                   f"{self.config.deadline_s} s")
        except Exception as exc:  # degrade, never fail the parent
            outcome = ChildOutcome("failed", error=f"{type(exc).__name__}: {exc}")
        record.status, record.synthesis = outcome.status, outcome.synthesis
        record.usage, record.error, record.cost = outcome.usage, outcome.error, outcome.cost
        if outcome.status == "completed":
            await run.emit(ev.SubDebateCompleted, **said, synthesis=outcome.synthesis or "",
                           usage=outcome.usage)
        else:
            await run.emit(ev.SubDebateFailed, **said, error=outcome.error or "failed",
                           usage=outcome.usage)
