"""A worker SIGKILLed in each phase a job goes through besides running: each phase of a
live reconfiguration (prepare, sync, an update while a large state moves, a fluid plan
between two of its stages), a checkpoint being written, and a recovery under way. Each
time the job recovers from its last complete checkpoint and its output, read from the
committed sink files, is the reference: every record once.

Every fault is injected at an event the coordinator tells (a reconfiguration's report
entering a phase, a checkpoint's report, a fluid stage made), or at a state observed in
the store with the worker then stopped to make it certain (a part's temp file: the write
is under way); never after a sleep.

The cluster is the module's own (3 local workers: jobs run on two, the third is a spare),
with its checkpoint store in a temporary directory; each test starts with 3 alive
workers (:func:`faults_support.listened`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from controlplane.abstraction import migrate, scale
from controlplane.coordinator.checkpoint_report import (
    CheckpointPolicy,
    CheckpointReport,
    RestartPolicy,
)
from controlplane.coordinator.report import RunReport
from controlplane.statuses import CheckpointStatus, JobStatus
from controlplane.statuses import ReconfigurationStatus as Status
from controlplane.testing import BackgroundCluster
from examples.wordcount import PaddedCount
from runtime.sinks import read_parts
from tests.faults_support import (
    Events,
    assert_exact,
    counting_job,
    finish_job,
    kill,
    reference,
    stale_sink_files,
    start_job,
    worker_writing,
)

pytestmark = pytest.mark.slow

PAD = 40_000  # bytes of state per key: 300 keys, 12 MB over the two count tasks
# Large state: checkpoints less often, and (full_every=1) every one writes each count
# task's whole state, so that a part's write takes a while.
LARGE = CheckpointPolicy(interval_s=0.5, timeout_s=60, retained=2, full_every=1)
# Room for a failed recovery attempt and the losses around it.
LENIENT = RestartPolicy(max_failures=6, window_s=120)


def kill_once(pid: int, when) -> tuple[list, object]:
    """A reconfiguration listener that SIGKILLs ``pid`` the first time ``when(report)``
    holds; returns the statuses it saw and the listener."""
    seen: list = []

    def listener(rec: RunReport) -> None:
        if when(rec) and "killed" not in seen:
            kill(pid)
            seen.append("killed")
        seen.append(rec.status)

    return seen, listener


def recovered_exactly(
    cluster: BackgroundCluster, fault_events: Events, job, out: Path, held: Path, victim: str
) -> RunReport:
    """Wait for the job's recovery (which names ``victim``), let the job end: its output
    is the reference. Returns the recovery's report."""
    fault_events.wait("a recovery", lambda: bool(fault_events.recoveries))
    problems = stale_sink_files(cluster, out)
    report, _ = fault_events.recoveries[0]
    assert report.status == Status.COMPLETED
    assert victim in report.plan["reason"], report.plan["reason"]
    assert victim not in job.layout.workers_used()
    finish_job(cluster, job, held)
    assert not problems, problems
    assert_exact(read_parts(out), reference())
    return report


# -- 1. A live reconfiguration: prepare, sync --------------------------------------------------


@pytest.mark.parametrize("phase", [Status.PREPARING, Status.SYNCING])
def test_a_worker_killed_as_a_scale_out_prepares_or_syncs(
    faults: BackgroundCluster, fault_events: Events, tmp_path: Path, held_end: Path, phase
) -> None:
    """count scales out from 2 to 3 tasks, the new one on the spare; as the plan enters
    ``phase`` the worker of count-1 (which gives key groups to count-2) is SIGKILLed.
    The plan does not complete; the job recovers from the checkpoint taken before it,
    on the layout of 2 count tasks, the victim's tasks on the spare."""
    co = faults.coordinator
    out = tmp_path / "out"
    job, _, spare = start_job(faults, fault_events, counting_job(out, held_end))
    victim = job.layout.placement["count-1"]
    seen, listener = kill_once(co.workers[victim].pid, lambda rec: rec.status == phase)
    plan = scale(co.current_abstraction(job.id), "count", 3, workers=[spare])
    rec = faults.call(co.apply_plan(job.id, plan, on_change=listener))
    assert "killed" in seen and seen[-1] == rec.status, seen
    assert rec.status in (Status.FAILED, Status.ABORTED), (rec.status, rec.error)
    report = recovered_exactly(faults, fault_events, job, out, held_end, victim)
    assert report.plan["lost_workers"] == [victim]
    assert job.layout.tasks_of("count") == ["count-0", "count-1"]


# -- 2. A live reconfiguration: an update while a large state is in flight -------------------


@pytest.mark.parametrize("who", ["receiver", "giver"])
def test_a_worker_killed_while_a_large_state_migrates(
    faults: BackgroundCluster, fault_events: Events, tmp_path: Path, held_end: Path, who: str
) -> None:
    """count-1 holds 6 MB of state (``PaddedCount``) and migrates, with its forward sink,
    to the spare; as the update starts (its state is shipped now) the worker receiving
    it or the one giving it is SIGKILLed. The migration fails, and the job recovers from
    the checkpoint taken before it."""
    co = faults.coordinator
    out = tmp_path / "out"
    graph = counting_job(out, held_end, PaddedCount(PAD))
    job, _, spare = start_job(faults, fault_events, graph, LARGE)
    giver = job.layout.placement["count-1"]
    victim = spare if who == "receiver" else giver
    seen, listener = kill_once(co.workers[victim].pid, lambda rec: rec.status == Status.UPDATING)
    plan = migrate(co.current_abstraction(job.id), "count-1", spare, with_forward=True)
    rec = faults.call(co.apply_plan(job.id, plan, on_change=listener))
    assert "killed" in seen and rec.status == Status.FAILED, (seen, rec.error)
    assert victim in (rec.error or ""), rec.error
    report = recovered_exactly(faults, fault_events, job, out, held_end, victim)
    assert report.plan["lost_workers"] == ([giver] if who == "giver" else [])
    assert [r.status for r in job.reconfigurations] == [Status.FAILED, Status.COMPLETED]


# -- 3. A fluid plan, between two of its stages -----------------------------------------------


def test_a_worker_killed_between_two_stages_of_a_fluid_plan(
    faults: BackgroundCluster, fault_events: Events, tmp_path: Path, held_end: Path
) -> None:
    """A fluid scale-out of count to 3 tasks (the new one on the spare) moves key groups
    4 at a time, each batch a stage of its own; once two steps are made, and the plan
    still runs, the worker of count-0 (a giver) is SIGKILLed. The plan ends failed, the
    steps it made undone by the recovery (the checkpoint was taken before it)."""
    co = faults.coordinator
    out = tmp_path / "out"
    job, _, spare = start_job(faults, fault_events, counting_job(out, held_end))
    victim = job.layout.placement["count-0"]
    seen, listener = kill_once(
        co.workers[victim].pid, lambda rec: rec.steps >= 2 and not rec.status.ended
    )
    plan = scale(co.current_abstraction(job.id), "count", 3, workers=[spare])
    plan = replace(plan, mode="fluid", batch_size=4)
    rec = faults.call(co.apply_plan(job.id, plan, on_change=listener))
    assert "killed" in seen, (seen, rec.steps, rec.error)
    assert rec.status == Status.FAILED and rec.steps >= 2, (rec.status, rec.steps, rec.error)
    report = recovered_exactly(faults, fault_events, job, out, held_end, victim)
    assert report.plan["lost_workers"] == [victim]
    assert job.layout.tasks_of("count") == ["count-0", "count-1"]


# -- 4. A checkpoint being written ---------------------------------------------------------------


def test_a_worker_killed_while_writing_its_part_of_a_checkpoint(
    faults: BackgroundCluster, fault_events: Events, tmp_path: Path, held_end: Path
) -> None:
    """Each checkpoint writes each count task's whole state (6 MB); a worker is caught
    with its part's temp file in the store (stopped there: see
    :func:`faults_support.worker_writing`), then SIGKILLed. That checkpoint never
    completes; the job recovers from the one before."""
    co = faults.coordinator
    out = tmp_path / "out"
    graph = counting_job(out, held_end, PaddedCount(PAD))
    job, _, _ = start_job(faults, fault_events, graph, LARGE)
    store = Path(co.config.checkpoint_store)
    victim, pid, cid = worker_writing(faults, store, job)
    kill(pid)
    report = recovered_exactly(faults, fault_events, job, out, held_end, victim)
    assert report.plan["lost_workers"] == [victim]
    assert report.plan["checkpoint_id"] < cid
    abandoned = fault_events.report(job.id, cid)
    assert abandoned.status == CheckpointStatus.ABANDONED, abandoned


# -- 5. A recovery under way -----------------------------------------------------------------------


@pytest.mark.parametrize("second", ["survivor", "spare"])
def test_a_second_worker_killed_while_the_job_recovers(
    faults: BackgroundCluster, fault_events: Events, tmp_path: Path, held_end: Path, second: str
) -> None:
    """The worker of count-1 is SIGKILLed as a checkpoint starts (so that one is in
    flight); the recovery that follows abandons it once the job's tasks are halted,
    and right then, the job ``recovering``, a second worker is SIGKILLed: the job's other
    worker (``survivor``) or the spare the lost tasks are about to go to (``spare``).
    That recovery attempt fails, and counts as a failure; the next one places the tasks
    on what is alive (a new worker from the backend where needed) and the output is
    exact."""
    co = faults.coordinator
    out = tmp_path / "out"
    graph = counting_job(out, held_end)
    job, used, spare = start_job(faults, fault_events, graph, restart=LENIENT)
    first = job.layout.placement["count-1"]
    victim = next(w for w in used if w != first) if second == "survivor" else spare
    pids = {first: co.workers[first].pid, victim: co.workers[victim].pid}
    killed: dict[str, object] = {}

    def inject(job_id: str, what: CheckpointReport | int) -> None:
        if job_id != job.id or not isinstance(what, CheckpointReport):
            return
        if what.status == CheckpointStatus.IN_PROGRESS and first not in killed:
            kill(pids[first])
            killed[first] = what.id
        elif what.status == CheckpointStatus.ABANDONED and victim not in killed:
            killed[victim] = (job.status, what.error)
            if job.status == JobStatus.RECOVERING:
                kill(pids[victim])

    fault_events.on_checkpoint = inject
    fault_events.wait("a recovery", lambda: bool(fault_events.recoveries))
    status, why = killed[victim]
    assert status == JobStatus.RECOVERING, (status, why)
    assert "the job is recovering" in why, why
    report, _ = fault_events.recoveries[0]
    assert first in report.plan["lost_workers"]
    assert {first, victim}.isdisjoint(job.layout.workers_used())
    problems = stale_sink_files(faults, out)
    finish_job(faults, job, held_end)
    assert not problems, problems
    assert_exact(read_parts(out), reference())
    # The attempt that failed names the worker it lost, as soon as it is lost (not once
    # the deploy timed out: the spare was no worker of the job's layout yet).
    failed = [c for _, c in job.failures.causes if c.startswith("recovery failed")]
    assert failed and victim in failed[0], job.failures.causes
    assert "timed out" not in failed[0], failed[0]
