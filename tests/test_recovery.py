"""Recovery from failures, with faults injected on purpose: a worker SIGKILLed while its
job runs, a task whose code fails; the job recovers from its last complete checkpoint
and its output is exactly the reference (nothing lost, nothing twice).

The cluster here is the module's own (its workers are killed), with a checkpoint store
in a temporary directory.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs_for_tests import counts_reference, identity, running_counts
from s3server import running_s3_server

from controlplane.coordinator import RuntimeConfig
from controlplane.coordinator.checkpoint_report import CheckpointPolicy, Failures
from controlplane.statuses import JobStatus
from controlplane.testing import BackgroundCluster
from runtime import Dataflow
from runtime.dataflow import JobGraph
from runtime.sinks import Collect, read_parts
from runtime.sources import Generator
from tests import faults_support
from tests.faults_support import Events

WAIT_S = 120.0
RECORDS = 40_000
KEYS = 300


@pytest.fixture(scope="module")
def fault_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundCluster]:
    yield from faults_support.fault_cluster(tmp_path_factory, workers=2)


@pytest.fixture
def events(fault_cluster: BackgroundCluster) -> Iterator[Events]:
    e = Events()
    co = fault_cluster.coordinator
    co.on_checkpoint, co.on_recovery = e.checkpoint, e.recovered
    yield e
    co.on_checkpoint = co.on_recovery = None
    for job in list(co.jobs.values()):
        if not job.done:
            fault_cluster.call(co.stop_job(job.id))


SOURCE = Generator(records=RECORDS, rate=8_000, keys=KEYS, seed=11)


def counts_to(path: Path) -> JobGraph:
    return running_counts("recovered_counts", SOURCE, str(path))


def reference() -> list[tuple[str, int]]:
    """Every (key, running count) the job emits once, in no order: replayed in process."""
    return counts_reference(SOURCE.open(index, 2, 0.0) for index in range(2))


def submit(cluster: BackgroundCluster, graph: JobGraph, interval_s: float = 0.2) -> Any:
    policy = CheckpointPolicy(interval_s=interval_s, timeout_s=60, retained=2)
    return cluster.call(cluster.coordinator.submit(graph, checkpoints=policy))


def worker_of(job: Any, task: str) -> str:
    return job.layout.placement[task]


def test_a_worker_killed_while_its_job_runs_is_recovered_from_and_the_output_is_exact(
    fault_cluster: BackgroundCluster, events: Events, tmp_path: Path
) -> None:
    job = submit(fault_cluster, counts_to(tmp_path / "out"))
    events.wait("2 completed checkpoints", lambda: events.completed(job.id) >= 2)
    victim = worker_of(job, "count-1")
    pid = fault_cluster.coordinator.workers[victim].pid
    os.kill(pid, signal.SIGKILL)
    events.wait("a recovery", lambda: bool(events.recoveries))
    report, version = events.recoveries[0]
    assert report.status == "completed" and report.plan["origin"] == "recovery"
    # The root cause first: the victim's loss, though a survivor may have told of its
    # broken data link to the victim before the coordinator saw the victim's connection close.
    assert report.plan["reason"].startswith(f"worker {victim} (pid {pid} "), report.plan["reason"]
    assert " died: " in report.plan["reason"] and report.plan["lost_workers"] == [victim]
    assert version["job"]["version"] == 2 and report.version == 2
    placed = {t["id"]: t["resources"]["worker"] for op in version["operators"] for t in op["tasks"]}
    assert victim not in placed.values()
    assert fault_cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    out = sorted((k, n) for k, n in read_parts(tmp_path / "out"))
    assert out == reference()


def test_a_recovery_s_reason_leads_with_a_worker_s_loss_heard_after_its_first_cause() -> None:
    """What a recovery heard, in the order heard: a survivor's broken link first, then the
    dead worker's loss, then another survivor's link. The reason names the loss first and
    keeps the rest, each once; without a loss heard, it is the first cause alone."""
    link = "worker w1: data link to worker w2 failed: [Errno 104] Connection reset by peer"
    other = "worker w3: data link to worker w2 failed: EOF"
    loss = "worker w2 (pid 7 on h) died: control connection lost"
    rec = Failures()
    rec.add(1.0, link)
    for heard, lost in [(loss, True), (other, False), (link, False)]:
        rec.hear(heard, lost=lost)
    assert rec.reason() == f"{loss}; also heard: {link}; {other}"
    assert rec.causes == [(1.0, link)]  # what the restart policy counts: one failure
    rec.add(2.0, loss, lost=True)  # a recovery that began with the loss
    assert rec.reason() == loss
    rec.add(3.0, link)
    rec.hear(other)
    assert rec.reason() == link


def test_sinks_moved_live_then_a_worker_killed_leave_the_committed_output_exact(
    fault_cluster: BackgroundCluster, events: Events, tmp_path: Path
) -> None:
    """Each sink task moves to the other worker (its open transaction left pending for
    the next checkpoint), then a worker dies: committed output is still exact."""
    out = tmp_path / "out"
    job = submit(fault_cluster, counts_to(out))
    events.wait("a completed checkpoint", lambda: events.completed(job.id) >= 1)
    layout = job.layout
    swapped = dict(layout.placement)
    swapped["out-0"], swapped["out-1"] = layout.placement["out-1"], layout.placement["out-0"]
    assert swapped["out-0"] != swapped["out-1"]
    report = fault_cluster.call(
        fault_cluster.coordinator.reconfigure(job.id, layout.replace(placement=swapped))
    )
    assert report.status == "completed", report.error
    # Whatever is visible now was committed by a complete checkpoint: no record twice.
    visible = [(k, n) for k, n in read_parts(out)]
    assert len(visible) == len(set(visible))
    victim = worker_of(job, "count-1")
    os.kill(fault_cluster.coordinator.workers[victim].pid, signal.SIGKILL)
    events.wait("a recovery", lambda: bool(events.recoveries))
    assert fault_cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    assert sorted((k, n) for k, n in read_parts(out)) == reference()
    assert not list((out / "_pending").iterdir())  # every transaction committed or undone


def fail_once(marker: str, key: Any, value: Any, state: Any) -> tuple:
    """Counts, and fails when key k00007 reaches 50 if the file ``marker`` does not exist
    yet, making it (so it fails once only)."""
    n = state.get(0) + 1
    state.set(n)
    if key == "k00007" and n == 50 and not os.path.exists(marker):
        Path(marker).touch()
        raise RuntimeError("injected failure at k00007 = 50")
    return ((key, n),)


def test_a_task_that_fails_once_is_recovered_from_and_the_output_is_exact(
    fault_cluster: BackgroundCluster, events: Events, tmp_path: Path
) -> None:
    marker = tmp_path / "failed-once"
    flow = Dataflow("fails_once")
    src = flow.source("src", SOURCE, parallelism=2)
    udf = functools.partial(fail_once, str(marker))
    src.key_by(identity).process("count", udf, parallelism=2).sink(
        "out", Collect(str(tmp_path / "out")), parallelism=2
    )
    job = submit(fault_cluster, flow.compile(), interval_s=0.1)
    assert fault_cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    assert marker.exists(), "the failure was never injected"
    (report, _version) = events.recoveries[0]
    assert "injected failure at k00007 = 50" in report.plan["reason"]
    out = sorted((k, n) for k, n in read_parts(tmp_path / "out"))
    assert out == reference()


def always_fail(key: Any, value: Any, state: Any) -> tuple:
    n = state.get(0) + 1
    state.set(n)
    if n > 40:
        raise RuntimeError(f"key {key} counted past 40")
    return ()


def test_a_job_that_keeps_failing_fails_with_every_cause_listed(
    fault_cluster: BackgroundCluster, events: Events
) -> None:
    flow = Dataflow("keeps_failing")
    src = flow.source("src", Generator(records=None, rate=2_000, keys=50, seed=3))
    src.key_by(identity).process("count", always_fail, parallelism=1)
    graph = flow.compile()
    job = submit(fault_cluster, graph, interval_s=0.05)
    assert fault_cluster.wait(job, WAIT_S) == JobStatus.FAILED
    assert job.error is not None and "restart policy" in job.error
    assert job.error.count("counted past 40") >= 2 and "[1]" in job.error


def test_a_job_without_a_complete_checkpoint_fails_and_says_so(
    fault_cluster: BackgroundCluster, events: Events
) -> None:
    flow = Dataflow("fails_at_once")
    src = flow.source("src", Generator(records=None, rate=2_000, keys=50, seed=3))
    src.key_by(identity).process("count", always_fail, parallelism=1)
    job = submit(fault_cluster, flow.compile(), interval_s=3600)
    assert fault_cluster.wait(job, WAIT_S) == JobStatus.FAILED
    assert "counted past 40" in (job.error or "")
    assert "no complete checkpoint" in (job.error or "")
    assert not events.recoveries


@pytest.fixture(scope="module")
def s3_cluster() -> Iterator[BackgroundCluster]:
    """Two workers whose checkpoints go to S3 (a real moto server in this process)."""
    with running_s3_server() as s3:
        s3.create_bucket("recovery")
        c = BackgroundCluster(
            workers=2, config=RuntimeConfig(checkpoint_store=s3.uri("recovery", "checkpoints"))
        )
        try:
            yield c
        finally:
            c.close()


def test_with_a_remote_store_surviving_tasks_restore_from_their_local_copies(
    s3_cluster: BackgroundCluster, tmp_path: Path
) -> None:
    events = Events()
    co = s3_cluster.coordinator
    co.on_checkpoint, co.on_recovery = events.checkpoint, events.recovered
    try:
        job = submit(s3_cluster, counts_to(tmp_path / "out"))
        events.wait("2 completed checkpoints", lambda: events.completed(job.id) >= 2)
        victim = worker_of(job, "count-1")
        survivor = worker_of(job, "count-0")
        assert survivor != victim
        os.kill(co.workers[victim].pid, signal.SIGKILL)
        events.wait("a recovery", lambda: bool(events.recoveries))
        report, _version = events.recoveries[0]
        restored = report.plan["restored"]
        (replacement,) = report.plan["placed_on"].values()
        # The survivor's key groups come from its own copies; the lost worker's from S3.
        assert restored[survivor]["local_bytes"] > 0 and restored[survivor]["store_bytes"] == 0
        assert restored[replacement]["store_bytes"] > 0
        assert restored[replacement]["local_bytes"] == 0
        assert s3_cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    finally:
        co.on_checkpoint = co.on_recovery = None
    out = sorted((k, n) for k, n in read_parts(tmp_path / "out"))
    assert out == reference()
