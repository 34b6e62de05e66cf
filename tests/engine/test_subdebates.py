"""Sub-debates run in process: trigger, re-issued 1b position, events, caps, degrade, accounting."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping

import msgspec
import pytest

from debatebus import Debate, Participant
from debatebus._usage import ZERO_USAGE
from debatebus.engine._prompts import ENGLISH, SPANISH
from debatebus.engine._result import Progress
from debatebus.engine._subdebates import (
    SubDebateRecord,
    SubDebates,
    TriggerResult,
    child_request_id,
    parse_marker,
)
from debatebus.exceptions import ConfigError
from debatebus.handlers._results import result_fields
from debatebus.llm import LLMRequest
from debatebus.llm._fakes import word_usage
from debatebus.schemas import events as ev
from debatebus.testing import FunctionLLM

TOPIC = "Should we ship the login redesign this week?"
MARK = "REQUEST_SUB_DEBATE: security"


class Script:
    """Answers by (speaker, purpose): the n-th call of a key gets the n-th scripted reply (the last
    one repeats), else ``"<speaker> <purpose> <n>"``. Records every request and its usage."""

    def __init__(self, replies: Mapping[tuple[str, str], list[str]] | None = None,
                 delays: Mapping[str, float] | None = None) -> None:
        self.replies = dict(replies or {})
        self.delays = dict(delays or {})
        self.requests: list[LLMRequest] = []
        self.seen: Counter[tuple[str, str]] = Counter()
        self.usage = ZERO_USAGE
        self.llm = FunctionLLM(self.answer, model="script")

    async def answer(self, request: LLMRequest) -> str:
        await asyncio.sleep(self.delays.get(request.speaker, 0))
        key = (request.speaker, request.purpose)
        self.seen[key] += 1
        self.requests.append(request)
        scripted = self.replies.get(key)
        if scripted:
            text = scripted[min(self.seen[key], len(scripted)) - 1]
        else:
            text = f"{request.speaker} {request.purpose} {self.seen[key]}"
        self.usage += word_usage(request, text)
        return text

    def prompts(self, speaker: str, purpose: str) -> list[str]:
        return [r.prompt for r in self.requests
                if (r.speaker, r.purpose) == (speaker, purpose)]


def security_panel(llm: FunctionLLM, **options) -> Debate:
    return Debate("security", [Participant("auditor", "You audit."),
                               Participant("attacker", "You attack.")],
                  llm=llm, protocol="cross-pollination", **options)


def parent(llm: FunctionLLM, sub_debates: SubDebates | None, **options) -> Debate:
    return Debate("launch", [Participant("alice", "You ship."), Participant("bob", "You test.")],
                  llm=llm, protocol="cross-pollination", sub_debates=sub_debates, **options)


def asking(*who: str, text: str = "I need a view.\n" + MARK) -> dict[tuple[str, str], list[str]]:
    return {(name, "revision"): [text, f"{name} revised with the panel"] for name in who}


async def test_a_request_runs_the_child_and_reissues_the_position_with_its_synthesis(events):
    script = Script(asking("alice") | {("synthesis", "synthesis"): ["synthesis 1", "panel says X"]})
    config = SubDebates(domains={"security": security_panel(script.llm)})
    result = await parent(script.llm, config).run(TOPIC, debate_id="p1", on_event=events)

    child_id = child_request_id("p1", "security", 1)
    assert child_id == "p1~sub-security-1"
    # The child's question: the parent's, plus the requester's position without the marker.
    child_question = ENGLISH.sub_debate_question.format(question=TOPIC, speaker="alice",
                                                        position="I need a view.")
    auditor_prompt = script.prompts("auditor", "position")[0]
    assert f"Topic: {child_question}\n" in auditor_prompt
    # The re-issued 1b prompt carries the child's synthesis; no second offer.
    first, again = script.prompts("alice", "revision")
    assert "REQUEST_SUB_DEBATE: <domain>" in first and "security" in first
    assert "REQUEST_SUB_DEBATE" not in again
    assert "concluded:\nsynthesis 1\n\nRevise your position again" in again
    revised = {t.speaker: t.text for t in result.rounds[1].turns}
    assert revised == {"alice": "alice revised with the panel", "bob": "bob revision 1"}
    assert [(r.domain, r.child_id, r.requested_by, r.status, r.synthesis)
            for r in result.sub_debates] == [("security", child_id, "alice", "completed",
                                              "synthesis 1")]
    assert result.synthesis == "panel says X"


async def test_events_in_order_with_the_childs_own_events_at_depth_1(events):
    script = Script(asking("alice"))
    config = SubDebates(domains={"security": security_panel(script.llm)})
    await parent(script.llm, config).run(TOPIC, debate_id="p1", on_event=events)

    child_id = "p1~sub-security-1"
    started = events.types.index("sub_debate_started")
    done = events.types.index("sub_debate_completed")
    child = [e for e in events.events if e.debate_id == child_id]
    assert [e.depth for e in child] == [1] * len(child)
    assert child[0].kind == "debate_started" and child[-1].kind == "debate_completed"
    assert events.events[started + 1] is child[0] and events.events[done - 1] is child[-1]
    (start,) = events.of(ev.SubDebateStarted)
    assert (start.domain, start.requested_by, start.child_request_id, start.participants,
            start.child_depth, start.depth) == ("security", "alice", child_id,
                                                ["auditor", "attacker"], 1, 0)
    assert all(e.depth == 0 for e in events.events if e.debate_id == "p1")
    # The parent's 1b round completes after the child, and its synthesis after that.
    own = [(i, e.kind) for i, e in enumerate(events.events) if e.debate_id == "p1"]
    after = [kind for i, kind in own if i > done]
    assert after[:3] == ["turn_completed", "round_completed", "phi_update"]  # alice re-issued
    assert after[-2:] == ["synthesis_completed", "debate_completed"]


async def test_usage_is_reported_per_debate_and_in_a_total():
    script = Script(asking("alice"))
    config = SubDebates(domains={"security": security_panel(script.llm)})
    result = await parent(script.llm, config).run(TOPIC)

    child_calls = [r for r in script.requests if r.speaker in ("auditor", "attacker")]
    assert len(child_calls) == 4
    (record,) = result.sub_debates
    child_usage = record.usage
    assert child_usage.total_tokens > 0
    assert result.children_usage == child_usage
    assert result.total_usage == script.usage  # every call made, parent's and child's
    assert result.token_usage == script.usage - child_usage
    assert result.calls == 2 + 3 + 1  # positions, revisions (alice's twice), synthesis


async def test_a_panel_of_participants_runs_on_the_parents_llm():
    script = Script(asking("bob"))
    config = SubDebates(domains={"security": [Participant("auditor", "You audit."),
                                              Participant("attacker", "You attack.")]})
    result = await parent(script.llm, config).run(TOPIC)
    assert result.sub_debates[0].status == "completed"
    assert len(script.prompts("attacker", "revision")) == 1
    # The panel child is at depth 1 with max_depth 1: it is not offered sub-debates.
    assert "REQUEST_SUB_DEBATE" not in script.prompts("attacker", "revision")[0]


def test_prompts_are_unchanged_without_sub_debates_and_offer_only_when_configured():
    script = Script()
    plain = parent(script.llm, None)
    assert plain.templates.revision == ENGLISH.prompts.revision
    with_children = parent(script.llm, SubDebates(domains={"security": "debate:security"}))
    assert with_children.templates.revision == str(ENGLISH.prompts.revision) + "{sub_debates}"
    assert with_children.definition_hash != plain.definition_hash
    spanish = parent(script.llm, SubDebates(domains={"security": "x"}), language="es")
    assert spanish.templates.revision == str(SPANISH.prompts.revision) + "{sub_debates}"


async def test_spanish_offer_is_used_when_asked():
    script = Script()
    config = SubDebates(domains={"seguridad": security_panel(script.llm)})
    await parent(script.llm, config, language="es").run(TOPIC)
    offer = SPANISH.sub_debate_offer.format(domains="seguridad")
    assert script.prompts("alice", "revision")[0].endswith(offer)
    assert script.prompts("alice", "position")[0].count("REQUEST_SUB_DEBATE") == 0


async def test_max_per_debate_skips_a_second_request_and_says_so(events):
    script = Script(asking("alice", "bob"), delays={"bob": 0.05})  # alice asks first
    config = SubDebates(domains={"security": security_panel(script.llm)}, max_per_debate=1)
    result = await parent(script.llm, config).run(TOPIC, on_event=events)

    assert [r.requested_by for r in result.sub_debates] == ["alice"]
    (skipped,) = events.of(ev.SubDebateSkipped)
    assert (skipped.requested_by, skipped.domain) == ("bob", "security")
    assert "max_per_debate 1" in skipped.reason
    bob = next(t for t in result.rounds[1].turns if t.speaker == "bob")
    assert bob.text == "I need a view."  # the stripped position, not re-issued
    assert len(script.prompts("bob", "revision")) == 1


async def test_a_second_marker_in_one_position_is_ignored_and_said_so(events):
    text = f"View.\n{MARK}\nREQUEST_SUB_DEBATE: privacy"
    script = Script(asking("alice", text=text))
    config = SubDebates(domains={"security": security_panel(script.llm),
                                 "privacy": security_panel(script.llm)}, max_per_debate=2)
    result = await parent(script.llm, config).run(TOPIC, on_event=events)
    assert [r.domain for r in result.sub_debates] == ["security"]
    (skipped,) = events.of(ev.SubDebateSkipped)
    assert skipped.domain == "privacy" and "one sub-debate per position" in skipped.reason


async def test_max_depth_zero_offers_nothing_and_skips_a_marker(events):
    script = Script(asking("alice"))
    config = SubDebates(domains={"security": security_panel(script.llm)}, max_depth=0)
    result = await parent(script.llm, config).run(TOPIC, on_event=events)
    assert "REQUEST_SUB_DEBATE" not in script.prompts("alice", "revision")[0]
    assert result.sub_debates == []
    assert "max_depth 0" in events.of(ev.SubDebateSkipped)[0].reason


async def test_a_child_at_max_depth_is_not_offered_and_cannot_start_grandchildren(events):
    script = Script(asking("alice") | asking("auditor"))
    grandchild = security_panel(script.llm)
    child = security_panel(script.llm, sub_debates=SubDebates(domains={"security": grandchild}))
    config = SubDebates(domains={"security": child}, max_depth=1)
    result = await parent(script.llm, config).run(TOPIC, on_event=events)
    # The child's own config allows depth < 1 only: at depth 1 it neither offers nor starts.
    assert "REQUEST_SUB_DEBATE: <domain>" not in script.prompts("auditor", "revision")[0]
    assert [e.depth for e in events.of(ev.SubDebateSkipped)] == [1]
    assert len(result.sub_debates) == 1


async def test_unknown_domain_is_skipped():
    script = Script(asking("alice", text="x\nREQUEST_SUB_DEBATE: astrology"))
    config = SubDebates(domains={"security": security_panel(script.llm)})
    result = await parent(script.llm, config).run(TOPIC)
    assert result.sub_debates == []
    assert result.rounds[1].turns[0].text == "x"


async def test_child_failure_degrades_to_the_stripped_position(events):
    script = Script(asking("alice"))
    broken = FunctionLLM(lambda r: (_ for _ in ()).throw(RuntimeError("down")), model="broken")
    config = SubDebates(domains={"security": security_panel(broken)})
    result = await parent(script.llm, config).run(TOPIC, on_event=events)

    assert result.ok
    (record,) = result.sub_debates
    assert record.status == "failed" and record.error
    (failed,) = events.of(ev.SubDebateFailed)
    assert failed.child_request_id == record.child_id
    assert result.rounds[1].turns[0].text == "I need a view."
    assert len(script.prompts("alice", "revision")) == 1


async def test_child_timeout_degrades_within_the_deadline(events):
    script = Script(asking("alice"), delays={"auditor": 5.0, "attacker": 5.0})
    config = SubDebates(domains={"security": security_panel(script.llm)}, deadline_s=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await parent(script.llm, config).run(TOPIC, on_event=events)
    assert loop.time() - started < 2.0
    assert result.ok and result.sub_debates[0].status == "failed"
    assert "deadline of 0.2 s" in (events.of(ev.SubDebateFailed)[0].error)


async def test_an_event_type_domain_needs_a_bus_and_degrades_in_process():
    script = Script(asking("alice"))
    config = SubDebates(domains={"security": "debate:security:request"})
    result = await parent(script.llm, config).run(TOPIC)
    assert result.ok
    assert "served on the bus" in (result.sub_debates[0].error or "")


async def test_the_trigger_is_replaceable():
    def hashtag(text: str) -> TriggerResult:
        words = text.split()
        asks = tuple(w[1:] for w in words if w.startswith("#"))
        return TriggerResult(" ".join(w for w in words if not w.startswith("#")), asks)

    script = Script(asking("alice", text="Look #security"))
    config = SubDebates(domains={"security": security_panel(script.llm)}, trigger=hashtag)
    result = await parent(script.llm, config).run(TOPIC)
    assert result.sub_debates[0].status == "completed"


async def test_a_resumed_run_reuses_its_finished_child_without_running_it():
    script = Script(asking("alice"))
    config = SubDebates(domains={"security": security_panel(script.llm)})
    first = await parent(script.llm, config).run(TOPIC, debate_id="p1")
    progress = Progress(rounds=first.rounds[:1], sub_debates=list(first.sub_debates))
    again = Script(asking("alice"))
    debate = parent(again.llm, SubDebates(domains={"security": security_panel(again.llm)}))
    result = await debate.run(TOPIC, debate_id="p1", resume=progress)
    assert not [r for r in again.requests if r.speaker in ("auditor", "attacker")]
    synthesis = first.sub_debates[0].synthesis
    assert f"concluded:\n{synthesis}\n" in again.prompts("alice", "revision")[1]
    assert result.sub_debates == first.sub_debates


def test_parse_marker_strips_every_marker_line():
    found = parse_marker("Point.\n**REQUEST_SUB_DEBATE: security**\nMore.\n> REQUEST_SUB_DEBATE: ops")
    assert found == TriggerResult("Point.\nMore.", ("security", "ops"))
    assert parse_marker("no marker") == TriggerResult("no marker")


@pytest.mark.parametrize("bad", [
    lambda: SubDebates(domains={}),
    lambda: SubDebates(domains={"s": "x"}, max_depth=-1),
    lambda: SubDebates(domains={"s": "x"}, deadline_s=0),
])
def test_bad_configuration_is_refused(bad: Callable[[], object]):
    with pytest.raises(ConfigError):
        bad()


def test_sub_debates_need_cross_pollination():
    with pytest.raises(ConfigError, match="cross-pollination"):
        Debate("rr", [Participant("a", "A")], llm=Script().llm,
               sub_debates=SubDebates(domains={"s": "x"}))


def test_records_round_trip_as_msgspec():
    record = SubDebateRecord(domain="s", child_id="c", requested_by="a", status="completed",
                             synthesis="y")
    assert msgspec.json.decode(msgspec.json.encode(record), type=SubDebateRecord) == record


async def test_result_fields_list_the_children_and_keep_own_usage_apart():
    script = Script(asking("alice"))
    config = SubDebates(domains={"security": security_panel(script.llm)})
    result = await parent(script.llm, config).run(TOPIC, debate_id="p1")
    fields = result_fields(result)
    (child,) = fields["debateSubDebates"]
    assert child | {"tokenUsage": None} == {
        "domain": "security", "debateId": "p1~sub-security-1", "requestedBy": "alice",
        "status": "completed", "synthesis": "synthesis synthesis 1", "tokenUsage": None,
        "error": None}
    own, kids = fields["debateTokenUsage"], fields["debateChildrenTokenUsage"]
    assert child["tokenUsage"] == kids and kids["totalTokens"] > 0
    assert fields["debateTotalTokenUsage"]["totalTokens"] == own["totalTokens"] + kids[
        "totalTokens"] == script.usage.total_tokens
    plain = result_fields(await parent(script.llm, None).run(TOPIC))
    assert "debateSubDebates" not in plain and "debateTotalTokenUsage" not in plain
