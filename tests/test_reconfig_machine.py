"""The reconfiguration protocol's pure state machine (controlplane.coordinator.protocol):
events in, commands out, no workers, no loop, no clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.coordinator.events import (
    Announce,
    Announced,
    CancelRequested,
    Command,
    Commit,
    End,
    EndStages,
    Event,
    Failed,
    FailJob,
    InjectSyncBarrier,
    Paused,
    Prepared,
    RunShape,
    SendAbort,
    SendPrepare,
    SendUpdate,
    StageDone,
    StageMessage,
    StageWithdrawn,
    Start,
    StartTimer,
    TaskFinished,
    TimedOut,
    Timer,
    Updated,
    union_affected,
)
from controlplane.coordinator.protocol import ReconfigurationMachine
from controlplane.coordinator.report import RunReport
from controlplane.statuses import ReconfigurationStatus as Status
from runtime.dataflow import load_job
from runtime.layout import Layout

GRAPH = load_job("examples.wordcount:build", {"records": 10, "parallelism": 2})
BASE = Layout.initial(GRAPH, ["w1", "w2"])  # x-0 on w1, x-1 on w2 for every operator


def with_groups(layout: Layout, c0: list[int], c1: list[int]) -> Layout:
    return layout.replace(
        assignment={**layout.assignment, "count-0": tuple(c0), "count-1": tuple(c1)}
    )


REBALANCED = with_groups(BASE, list(range(32)), list(range(32, 128)))


class Run:
    """A machine and the commands it gave, with a clock that moves 1 ms per event."""

    def __init__(self, new: Layout = REBALANCED, stages: tuple[Layout, ...] = (), window=1):
        path = [BASE, *stages] if stages else [BASE, new]
        affected = union_affected(GRAPH, path)
        self.shape = RunShape(GRAPH, BASE, new, affected, stages, 10.0, window)
        self.report = RunReport(7, "job", set(affected))
        self.machine = ReconfigurationMachine(self.shape, self.report)
        self.now = 0.0
        self.commands: list[Command] = []

    def __call__(self, *events: Event) -> list[Command]:
        out: list[Command] = []
        for event in events:
            self.now += 0.001
            got = self.machine.handle(event, self.now)
            out += got
            self.commands += got
        return out

    def prepared(self) -> list[Command]:
        self(Start(), Announced())
        return self(*(Prepared(w) for w in self.shape.workers))

    def synced(self) -> list[Command]:
        self.prepared()
        self(Announced())
        paused = [t for t in self.shape.affected if t in BASE.placement]
        return self(*(Paused(t) for t in paused))

    def updated_events(self) -> list[Event]:
        return [
            Updated(layout.placement[t], t, 1.0, 2.0)
            for layout in (self.shape.old, self.shape.new)
            for t in self.shape.affected
            if t in layout.placement
        ]


def kinds(commands: list[Command]) -> list[type]:
    return [type(c) for c in commands]


def test_a_run_goes_through_every_phase_and_commits() -> None:
    run = Run()
    assert run(Start()) == [Announce(then_continue=True)]
    assert run.report.status == Status.PREPARING
    assert kinds(run(Announced())) == [SendPrepare, StartTimer]
    assert run(Prepared("w1")) == []
    assert run(Prepared("w2"))[-1] == Announce(then_continue=True)
    assert run.report.status == Status.SYNCING
    assert InjectSyncBarrier() in run(Announced())
    tasks = sorted(t for t in run.shape.affected if t in BASE.placement)
    for t in tasks[:-1]:
        assert run(Paused(t)) == []
    assert run(Paused(tasks[-1]))[-1] == Announce(then_continue=True)
    assert run.report.status == Status.UPDATING
    assert SendUpdate() in run(Announced())
    out = run(*run.updated_events())
    assert Commit(REBALANCED) in out and out[-1] == End()
    assert run.report.status == Status.COMPLETED and run.machine.ended
    assert set(run.report.timings_ms) == {"prepare", "sync", "update", "total"}
    assert set(run.report.pause_ms) <= run.shape.affected
    assert run(Paused("count-0"), TimedOut(Timer.UPDATE)) == []  # late news is dropped


def test_a_prepare_error_aborts_with_every_distinct_error_once() -> None:
    run = Run()
    run(Start(), Announced(), Prepared("w2", "boom"))
    out = run(Prepared("w1", "boom"))
    assert SendAbort() in out and out[-1] == End(aborted=True)
    assert (run.report.status, run.report.error) == (Status.FAILED, "prepare failed: boom")


def test_a_silent_prepare_times_out() -> None:
    run = Run()
    run(Start(), Announced(), Prepared("w1"))
    run(TimedOut(Timer.PREPARE))
    assert (run.report.status, run.report.error) == (
        Status.FAILED,
        "prepare failed: prepare timed out after 15s",
    )


def test_a_sync_timeout_aborts_naming_the_tasks_that_did_not_pause() -> None:
    run = Run()
    run.prepared()
    run(Announced(), Paused("count-0"))
    out = run(TimedOut(Timer.SYNC))
    assert SendAbort() in out
    assert run.report.status == Status.ABORTED
    assert run.report.error.startswith("sync timed out after 10s: tasks ['count-1'")


def test_a_cancel_while_a_listener_hears_of_the_sync_sends_no_barrier() -> None:
    run = Run()
    run.prepared()
    run(CancelRequested("not now"))  # told while the listeners hear of "syncing"
    out = run(Announced())
    assert InjectSyncBarrier() not in out and SendAbort() in out
    assert (run.report.status, run.report.error) == (Status.CANCELLED, "not now")


def test_a_cancel_while_preparing_aborts_at_once() -> None:
    run = Run()
    run(Start(), Announced(), Prepared("w1"))
    run(CancelRequested("not now"))
    assert (run.report.status, run.report.error) == (Status.CANCELLED, "not now")


def test_a_failure_in_sync_aborts_unless_the_job_ended() -> None:
    for job_ended, status in ((False, Status.ABORTED), (True, Status.FAILED)):
        run = Run()
        run.prepared()
        run(Announced(), Failed("worker w2 died", job_ended))
        assert (run.report.status, run.report.error) == (status, "worker w2 died")


def test_a_task_that_finishes_before_the_barrier_fails_the_sync() -> None:
    run = Run()
    run.prepared()
    run(Announced(), TaskFinished("count-1"))
    assert run.report.error == "task count-1 finished before it reached the barrier"


def test_a_failure_in_the_update_fails_the_job() -> None:
    run = Run()
    run.synced()
    run(Announced())
    out = run(Failed("state lost"))
    assert FailJob("reconfiguration 7 failed during update: state lost") in out
    assert run.report.status == Status.FAILED
    assert Commit(REBALANCED) not in run.commands


def stages() -> tuple[Layout, ...]:
    """Three stages, each moving 16 more key groups from count-0 to count-1."""
    return tuple(
        with_groups(BASE, list(range(64 - 16 * k)), list(range(64 - 16 * k, 128)))
        for k in (1, 2, 3)
    )


def staged_until_update() -> Run:
    layouts = stages()
    run = Run(layouts[-1], layouts)
    run.synced()
    run(Announced())
    return run


def test_stages_start_one_after_the_other_and_the_run_commits_the_last() -> None:
    run = staged_until_update()
    out = run(StageDone("w1", 0), StageDone("w2", 0))
    first = [c for c in out if isinstance(c, StageMessage)]
    assert [(m.stage, m.withdraw) for m in first] == [(1, False)]
    assert run.report.stages_made == 1
    done_by = [w for w, _ in first[0].to]
    run(*(StageDone(w, 1) for w in done_by))
    assert run.report.stages_made == 2
    run(*(StageDone(w, 2) for w in done_by))
    assert run.report.stages_made == 3 and len(run.report.stage_ms) == 2
    out = run(*run.updated_events())
    assert Commit(stages()[-1]) in out and run.report.status == Status.COMPLETED


def test_a_cancelled_staged_run_withdraws_its_stage_and_ends_on_the_one_before() -> None:
    run = staged_until_update()
    run(StageDone("w1", 0), StageDone("w2", 0))
    started = next(c for c in run.commands if isinstance(c, StageMessage))
    out = run(CancelRequested("enough"))
    assert StageMessage(1, True, started.to) in out  # withdrawn
    out = run(*(StageWithdrawn(w, True) for w, _ in started.to))
    assert EndStages(0) in out
    assert run.report.cut_short and run.report.error == "enough"
    out = run(*run.updated_events())
    assert Commit(stages()[0]) in out and run.report.status == Status.COMPLETED


def test_a_stage_that_had_started_goes_on_when_it_cannot_be_withdrawn() -> None:
    run = staged_until_update()
    run(StageDone("w1", 0), StageDone("w2", 0))
    started = next(c for c in run.commands if isinstance(c, StageMessage))
    run(TimedOut(Timer.STAGE))
    out = run(*(StageWithdrawn(w, False) for w, _ in started.to))
    assert StageMessage(1, False, started.to) in out  # told again
    run(*(StageDone(w, 1) for w, _ in started.to))
    assert run.report.stages_made == 2 and not run.report.cut_short


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 11), max_size=40), st.integers(0, 2))
def test_whatever_happens_a_run_ends_once_and_says_how(script: list[int], stage_mode: int) -> None:
    """Random interleavings of replies, timeouts, cancels and failures: the machine never
    raises, ends at most once with an ended status, and commits only when completed."""
    layouts = stages()
    run = Run(layouts[-1], layouts, window=stage_mode) if stage_mode else Run()
    workers = run.shape.workers
    pool: list[Event] = [
        Announced(),
        *(Prepared(w) for w in workers),
        *(Paused(t) for t in sorted(run.shape.affected)),
        *run.updated_events(),
        *(StageDone(w, k) for w in workers for k in range(3)),
        *(StageWithdrawn(w, True) for w in workers),
        CancelRequested("stop"),
        Failed("boom"),
        *(TimedOut(t) for t in Timer),
    ]
    run(Start())
    for i in script:
        run(pool[(i * 7 + len(run.commands)) % len(pool)])
    ends = [c for c in run.commands if isinstance(c, End)]
    assert len(ends) <= 1
    if ends:
        assert run.report.status.ended
        commits = [c for c in run.commands if isinstance(c, Commit)]
        assert bool(commits) == (run.report.status == Status.COMPLETED)
