"""Recovery from faults injected on purpose, beyond ``test_recovery``: a Spark-hosted
worker lost, a worker lost in the middle of a reconfiguration's update, a spare worker
lost (nothing happens), a worker that stops answering (heartbeat missed), and two
failures in a row. Each job's output is the in-process reference: nothing lost, nothing
twice.

The clusters are this module's own (their workers are killed), with checkpoint stores
in temporary directories: a local one of 3 workers (jobs run on two, the third is a
spare) and one of 2 Spark-hosted workers. Each test first brings the local cluster back
to 3 alive workers (:func:`faults_support.top_up`).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from controlplane.abstraction import migrate
from controlplane.coordinator import RuntimeConfig
from controlplane.coordinator.report import RunReport
from controlplane.statuses import JobStatus, ReconfigurationStatus
from controlplane.testing import BackgroundCluster
from tests.faults_support import (
    HEARTBEAT_TIMEOUT_S,
    WAIT_S,
    Events,
    checkpoint_id_gaps,
    counting_job,
    exact_output,
    gone,
    kill,
    listening,
    lost,
    stale_sink_files,
    submit,
    top_up,
)

pytestmark = pytest.mark.slow

SPARK_TEST_TIMEOUT_S = 300  # a Spark worker's replacement is a Spark job: slower than a process


def stop_leftover_jobs(cluster: BackgroundCluster) -> None:
    for job in list(cluster.coordinator.jobs.values()):
        if not job.done:
            cluster.call(cluster.coordinator.stop_job(job.id))


@pytest.fixture(scope="module")
def local_faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundCluster]:
    store = tmp_path_factory.mktemp("checkpoints")
    c = BackgroundCluster(workers=3, config=RuntimeConfig(checkpoint_store=str(store)))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def events(local_faults: BackgroundCluster) -> Iterator[Events]:
    """The local cluster with 3 alive workers, its events told to the test."""
    top_up(local_faults, 3)
    with listening(local_faults, Events()) as e:
        yield e
    stop_leftover_jobs(local_faults)


def placement(version: dict) -> dict[str, str]:
    """Task -> worker in an abstraction version (as a dict)."""
    return {t["id"]: t["resources"]["worker"] for op in version["operators"] for t in op["tasks"]}


def start(cluster: BackgroundCluster, events: Events, tmp_path: Path, held: Path) -> tuple:
    """The counting job on the two oldest alive workers, running, with 2 complete
    checkpoints; returns it, its output directory, those two workers and a spare."""
    alive = [w.id for w in cluster.coordinator.alive_workers()]
    used, spare = alive[:2], alive[2] if len(alive) > 2 else None
    out = tmp_path / "out"
    job = submit(cluster, counting_job(out, held), used)
    assert job.status == JobStatus.RUNNING, job.error
    events.wait("2 complete checkpoints", lambda: events.completed(job.id) >= 2)
    return job, out, used, spare


def finish(
    cluster: BackgroundCluster, job, out: Path, held: Path, problems: list[str] | None = None
) -> None:
    """Let the job end; it finishes and its output is exact. ``problems``: what the test
    saw go wrong on the way (a sink left holding its file after the recovery's halt,
    checkpoint ids handed out in bulk by a spinning timer), reported with the output's
    exactness."""
    held.unlink()
    assert cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    exact = exact_output(out)
    assert not problems, f"{'; '.join(dict.fromkeys(problems))} (the output was exact: {exact})"
    assert exact, "the output is not the reference (records lost or twice)"


# -- 1. A Spark-hosted worker lost ------------------------------------------------------------


@pytest.fixture(scope="module")
def spark_faults(spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundCluster]:
    """2 workers as Spark tasks of the session's ``local[2]`` SparkSession (both slots)."""
    store = tmp_path_factory.mktemp("spark-checkpoints")
    c = BackgroundCluster(
        workers=2, backend="spark", config=RuntimeConfig(checkpoint_store=str(store))
    )
    try:
        yield c
    finally:
        c.close()


@pytest.mark.timeout(SPARK_TEST_TIMEOUT_S)
@pytest.mark.parametrize("what", ["python_worker", "worker_process"])
def test_a_spark_worker_lost_is_replaced_by_a_new_spark_worker_and_the_output_is_exact(
    spark_faults: BackgroundCluster, tmp_path: Path, held_end: Path, what: str
) -> None:
    """In local mode the executor is the driver's own JVM, which cannot die alone. What
    dies with an executor is the Python worker Spark runs the worker's task in
    (``python_worker``, a fork of PySpark's daemon: SIGKILLed, Spark fails the task with
    "Python worker exited unexpectedly (crashed)" and the worker process dies with its
    parent), or the worker process itself (``worker_process``: the task fails with
    "runtime.worker exited with code -9"). Either way the coordinator loses the worker,
    its Spark slot is free again, and the recovery asks the Spark backend for a new
    worker in its place (there is no spare: the two workers hold both slots)."""
    co = spark_faults.coordinator
    with listening(spark_faults, Events()) as events:
        try:
            job, out, used, _ = start(spark_faults, events, tmp_path, held_end)
            victim = job.layout.placement["count-1"]
            info = co.workers[victim]
            worker = psutil.Process(info.pid)
            target = worker.parent() if what == "python_worker" else worker
            assert target is not None
            if what == "python_worker":  # a fork of PySpark's daemon, not the daemon itself
                daemon = target.parent()
                assert daemon is not None and "pyspark.daemon" in daemon.cmdline()
                assert "pyspark.daemon" in target.cmdline(), target.cmdline()
            before = set(co.workers)
            kill(target.pid)
            events.wait("a recovery", lambda: bool(events.recoveries))
            report, version = events.recoveries[0]
            assert report.status == ReconfigurationStatus.COMPLETED
            assert report.plan["origin"] == "recovery" and report.plan["lost_workers"] == [victim]
            new = report.plan["placed_on"][victim]
            assert new not in before, f"{victim}'s tasks went to {new}, not a new worker"
            assert co.workers[new].name.startswith("spark-") and co.workers[new].executor_id
            assert version["job"]["version"] == 2
            assert set(placement(version).values()) == {*used, new} - {victim}
            problems = stale_sink_files(spark_faults, out)
            assert gone(info.pid), f"worker process {info.pid} is still there"
            assert lost(spark_faults, victim) and len(job.failures.causes) == 1
            finish(spark_faults, job, out, held_end, problems)
        finally:
            stop_leftover_jobs(spark_faults)


# -- 2. A worker lost in the middle of a reconfiguration ---------------------------------------


@pytest.mark.parametrize("who", ["receiver", "giver"])
def test_a_worker_lost_while_a_migration_updates_fails_it_and_the_job_recovers(
    local_faults: BackgroundCluster, events: Events, tmp_path: Path, held_end: Path, who: str
) -> None:
    """count-1 (and its forward sink) migrate to the spare worker; as the update starts
    (the report says ``updating``: state is about to move), the worker receiving the
    state (``receiver``) or the one giving it (``giver``) is SIGKILLed. The
    reconfiguration ends ``failed``, the job recovers from its last checkpoint (taken
    before the migration) and finishes with the exact output."""
    co = local_faults.coordinator
    job, out, used, spare = start(local_faults, events, tmp_path, held_end)
    giver = job.layout.placement["count-1"]
    victim = spare if who == "receiver" else giver
    pid = co.workers[victim].pid
    seen: list[str] = []

    def kill_when_updating(rec: RunReport) -> None:
        if rec.status == ReconfigurationStatus.UPDATING and rec.status not in seen:
            kill(pid)
        seen.append(rec.status)

    plan = migrate(co.current_abstraction(job.id), "count-1", spare, with_forward=True)
    rec = local_faults.call(co.apply_plan(job.id, plan, on_change=kill_when_updating))
    assert ReconfigurationStatus.UPDATING in seen and seen[-1] == rec.status, seen
    assert rec.status == ReconfigurationStatus.FAILED, (rec.status, rec.error)
    assert victim in (rec.error or ""), rec.error
    events.wait("a recovery", lambda: bool(events.recoveries))
    problems = stale_sink_files(local_faults, out)
    report, version = events.recoveries[0]
    assert report.status == ReconfigurationStatus.COMPLETED
    assert victim in report.plan["reason"]
    # The checkpoint was taken before the migration: its layout is on the two first
    # workers. A lost giver's tasks go to the spare; a lost receiver hosted none of them.
    if who == "giver":
        assert report.plan["lost_workers"] == [giver]
        assert report.plan["placed_on"] == {giver: spare}
        assert set(job.layout.workers_used()) == {*used, spare} - {giver}
    else:
        assert report.plan["lost_workers"] == [] and report.plan["placed_on"] == {}
        assert set(job.layout.workers_used()) == set(used)
    assert placement(version) == dict(job.layout.placement)
    assert [r.status for r in job.reconfigurations] == ["failed", "completed"]
    assert job.abstraction.version == 2 and report.version == 2
    finish(local_faults, job, out, held_end, problems)


# -- 3. A spare worker lost: nothing happens ---------------------------------------------------


def test_a_spare_worker_lost_does_not_disturb_the_job(
    local_faults: BackgroundCluster, events: Events, tmp_path: Path, held_end: Path
) -> None:
    """A negative control: the worker no job uses is SIGKILLed; the coordinator sees it
    lost, the job keeps taking checkpoints, never recovers nor fails, stays on its first
    version and finishes with the exact output."""
    co = local_faults.coordinator
    job, out, _, spare = start(local_faults, events, tmp_path, held_end)
    assert spare is not None and spare not in job.layout.workers_used()
    done = events.completed(job.id)
    kill(co.workers[spare].pid)
    events.wait(
        "the spare lost and 2 more complete checkpoints",
        lambda: lost(local_faults, spare) and events.completed(job.id) >= done + 2,
    )
    finish(local_faults, job, out, held_end)
    assert not events.recoveries
    assert job.failures.causes == [] and job.error is None
    assert job.reconfigurations == [] and len(job.versions) == 1


# -- 4. A heartbeat missed ---------------------------------------------------------------------


def test_a_stopped_worker_misses_its_heartbeats_and_the_job_recovers(
    local_faults: BackgroundCluster, events: Events, tmp_path: Path, held_end: Path
) -> None:
    """SIGSTOP a worker hosting the job's tasks: its connections stay open but it says
    nothing; past the heartbeat timeout (lowered for this test) the coordinator declares
    it lost and the job recovers onto the spare. The stopped process is killed after.
    The checkpoint in flight while it was silent could not complete: the coordinator
    keeps declining ticks meanwhile, not spinning (checkpoint ids stay close)."""
    co = local_faults.coordinator
    job, out, _, spare = start(local_faults, events, tmp_path, held_end)
    victim = job.layout.placement["count-0"]
    pid = co.workers[victim].pid
    before = co.heartbeat_timeout_s
    co.heartbeat_timeout_s = HEARTBEAT_TIMEOUT_S
    try:
        kill(pid, signal.SIGSTOP)
        events.wait("a recovery", lambda: bool(events.recoveries))
    finally:
        co.heartbeat_timeout_s = before
        kill(pid)  # a stopped process dies of SIGKILL all the same; the backend reaps it
    problems = stale_sink_files(local_faults, out)
    report, _ = events.recoveries[0]
    assert "no heartbeat for" in report.plan["reason"], report.plan["reason"]
    assert report.plan["lost_workers"] == [victim]
    assert report.plan["placed_on"] == {victim: spare}
    events.wait("a complete checkpoint of version 2", lambda: events.completed(job.id, 2) >= 1)
    if gaps := checkpoint_id_gaps(events.ids(job.id)):
        problems.append(f"checkpoint ids went {gaps}: the checkpoint timer spun")
    assert len(job.failures.causes) == 1
    finish(local_faults, job, out, held_end, problems)


# -- 5. Two failures in a row ------------------------------------------------------------------


@pytest.mark.parametrize("when", ["after_a_new_checkpoint", "as_the_job_resumes"])
def test_two_failures_in_a_row_are_both_recovered_from(
    local_faults: BackgroundCluster, events: Events, tmp_path: Path, held_end: Path, when: str
) -> None:
    """One worker of the job is SIGKILLed; the job recovers onto the spare. Then a second
    worker is: ``after_a_new_checkpoint`` the first recovery's version completed a
    checkpoint, and the worker it kept is killed; ``as_the_job_resumes`` the replacement
    is killed as the first recovery is told (before another checkpoint can complete), so
    the second recovery goes back to the same checkpoint. No spare is left: the second
    recovery asks the backend for a new worker. Within the restart policy (3 in 60 s)
    both recover and the output is exact."""
    co = local_faults.coordinator
    job, out, used, spare = start(local_faults, events, tmp_path, held_end)
    first = job.layout.placement["count-1"]
    kept = next(w for w in used if w != first)
    workers_before = set(co.workers)
    second = spare if when == "as_the_job_resumes" else kept

    def kill_the_replacement(job_id: str, report: RunReport) -> None:
        if len(events.recoveries) == 0:
            kill(co.workers[spare].pid)

    if when == "as_the_job_resumes":
        events.after_recovery = kill_the_replacement
    kill(co.workers[first].pid)
    events.wait("a recovery", lambda: bool(events.recoveries))
    problems = stale_sink_files(local_faults, out)
    one, _ = events.recoveries[0]
    assert one.plan["lost_workers"] == [first] and one.plan["placed_on"] == {first: spare}
    if when == "after_a_new_checkpoint":
        events.wait("a complete checkpoint of version 2", lambda: events.completed(job.id, 2) >= 1)
        kill(co.workers[second].pid)
    events.wait("a second recovery", lambda: len(events.recoveries) >= 2)
    problems += stale_sink_files(local_faults, out)
    two, version = events.recoveries[1]
    assert second in two.plan["reason"], two.plan["reason"]
    assert two.version == 3 and version["job"]["version"] == 3
    lost_now = two.plan["lost_workers"]
    if when == "as_the_job_resumes":  # the same checkpoint, on the first two workers
        assert lost_now == [first] and one.plan["checkpoint_id"] == two.plan["checkpoint_id"]
    else:
        assert lost_now == [second] and two.plan["checkpoint_id"] > one.plan["checkpoint_id"]
    replacement = two.plan["placed_on"][lost_now[0]]
    assert replacement not in workers_before, f"{replacement} is not a new worker"
    assert set(job.layout.workers_used()).isdisjoint({first, second})
    assert len(job.failures.causes) == 2
    finish(local_faults, job, out, held_end, problems)
