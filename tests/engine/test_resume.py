"""Commit hooks and resume: the contract checkpoints are built on."""

from __future__ import annotations

from debatebus import Budget, Debate, Judge, Participant
from debatebus.engine import Progress, Prompts, Round, Turn
from debatebus.schemas import events as ev

TOPIC = "Monorepo or polyrepo?"
NAMES = ("alice", "bob", "carol")
BARE = Prompts(opening="{transcript}", rebuttal="{transcript}", synthesis="{transcript}")
R1 = ("Round 1:\nalice said:\n> alice opening 1\nbob said:\n> bob opening 1\ncarol said:\n"
      "> carol opening 1")


def people() -> list[Participant]:
    return [Participant(n, f"You are {n}.") for n in NAMES]


def repo_debate(stage, **options) -> Debate:
    options.setdefault("max_rounds", 3)
    options.setdefault("prompts", BARE)
    return Debate(
        "repos",
        people(),
        llm=stage.llm,
        moderator=Participant("moderator", "M"),
        judge=Judge(),
        **options,
    )


class Commits:
    """An ``on_commit`` hook that snapshots the progress at every commit."""

    def __init__(self, log: list[str] | None = None) -> None:
        self.items: list[Turn | Round] = []
        self.snapshots: list[Progress] = []
        self.log = log

    async def __call__(self, progress: Progress, item: Turn | Round) -> None:
        self.items.append(item)
        self.snapshots.append(
            Progress(progress.framing, list(progress.rounds), progress.usage, progress.calls)
        )
        if self.log is not None:
            self.log.append(f"commit {item.round if isinstance(item, Turn) else item.number}")


async def test_on_commit_follows_framing_and_every_round_in_order(make_stage):
    log: list[str] = []
    commits = Commits(log)

    def on_event(event: ev.DebateEvent) -> None:
        log.append(event.kind)

    stage = make_stage()
    result = await repo_debate(stage).run(TOPIC, on_commit=commits, on_event=on_event)

    framing, *rounds = commits.items
    assert isinstance(framing, Turn)
    assert (framing.speaker, framing.round, framing.text) == ("moderator", 0, "moderator framing 0")
    assert [r.number for r in rounds] == [1, 2, 3]
    assert rounds == result.rounds
    assert [len(s.rounds) for s in commits.snapshots] == [0, 1, 2, 3]
    assert [s.calls for s in commits.snapshots] == [1, 5, 9, 13]
    assert all(s.framing == framing for s in commits.snapshots)
    # A commit happens before the event announcing what was committed.
    assert log.index("commit 0") < log.index("framing_completed")
    for number in (1, 2, 3):
        verdict = [i for i, x in enumerate(log) if x == "verdict"][number - 1]
        completed = [i for i, x in enumerate(log) if x == "round_completed"][number - 1]
        assert verdict < log.index(f"commit {number}") < completed


async def test_resume_continues_after_the_committed_rounds(make_stage, events):
    first = make_stage()
    commits = Commits()
    uninterrupted = await repo_debate(first).run(TOPIC, on_commit=commits)
    after_round_1 = commits.snapshots[1]

    second = make_stage()
    result = await repo_debate(second).run(TOPIC, resume=after_round_1, on_event=events)

    assert second.keys == [
        ("alice", "rebuttal", 2),
        ("bob", "rebuttal", 2),
        ("carol", "rebuttal", 2),
        ("judge", "judge", 2),
        ("alice", "rebuttal", 3),
        ("bob", "rebuttal", 3),
        ("carol", "rebuttal", 3),
        ("judge", "judge", 3),
        ("moderator", "synthesis", 3),
    ]
    assert (
        second.prompt_of("alice", "rebuttal", 2) == R1
    )  # the committed round is in the transcript
    assert result.status == "completed"
    assert result.resumed_from_round == 1
    assert result.rounds[0] == after_round_1.rounds[0]
    assert [r.number for r in result.rounds] == [1, 2, 3]
    assert result.framing == "moderator framing 0"
    assert result.output == uninterrupted.output
    assert result.token_usage == after_round_1.usage + second.expected_usage()
    assert result.token_usage == uninterrupted.token_usage
    assert result.calls == after_round_1.calls + len(second.requests) == uninterrupted.calls
    assert events.events[0].resumed_from_round == 1
    assert [e.round for e in events.of(ev.RoundStarted)] == [2, 3]
    assert len(after_round_1.rounds) == 1  # the caller's progress is not mutated


async def test_resume_after_framing_only_skips_the_framing_call(make_stage):
    commits = Commits()
    await repo_debate(make_stage()).run(TOPIC, on_commit=commits)
    second = make_stage()
    result = await repo_debate(second, prompts=None).run(TOPIC, resume=commits.snapshots[0])

    assert second.keys[0] == ("alice", "opening", 1)
    assert "Framing: moderator framing 0" in second.prompt_of("alice", "opening", 1)
    assert result.resumed_from_round == 0
    assert result.framing == "moderator framing 0"


async def test_resume_of_a_debate_that_had_reached_consensus_goes_to_synthesis(make_stage):
    commits = Commits()
    first = await repo_debate(make_stage(consensus_at=2), max_rounds=5).run(
        TOPIC, on_commit=commits
    )
    assert first.satisfied is True
    second = make_stage(consensus_at=2)
    result = await repo_debate(second, max_rounds=5).run(TOPIC, resume=commits.snapshots[-1])

    assert second.keys == [("moderator", "synthesis", 2)]
    assert result.satisfied is True
    assert result.output == first.output


async def test_resume_counts_committed_calls_against_the_budget(make_stage):
    commits = Commits()
    await repo_debate(make_stage()).run(TOPIC, on_commit=commits)
    after_round_1 = commits.snapshots[1]  # 5 calls: framing + 3 turns + verdict
    second = make_stage()
    result = await repo_debate(second, budget=Budget(max_calls=7)).run(TOPIC, resume=after_round_1)

    assert len(second.requests) == 2
    assert result.status == "failed"
    assert "budget max_calls=7 reached" in result.error
    assert result.calls == 7


async def test_cross_pollination_resumes_after_the_position_phase(make_stage):
    commits = Commits()
    participants = people()

    def cross(stage) -> Debate:
        return Debate(
            "repos-x", participants, llm=stage.llm, protocol="cross-pollination", audience="devs"
        )

    first = await cross(make_stage()).run(TOPIC, on_commit=commits)
    assert [(item.number, item.phase) for item in commits.items] == [
        (0, "audience"),
        (1, "position"),
        (2, "revision"),
    ]
    second = make_stage()
    result = await cross(second).run(TOPIC, resume=commits.snapshots[1])

    assert [k[1] for k in second.keys] == ["revision"] * 3 + ["synthesis"]
    assert "[bob] bob position 1" in second.prompt_of("alice", "revision", 2)
    assert "Audience: audience audience 0" in second.prompt_of("alice", "revision", 2)
    assert result.output == first.output
    assert result.phi_hat == first.phi_hat
    assert result.token_usage == first.token_usage
