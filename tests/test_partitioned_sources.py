"""Partitioned sources end to end, with real worker processes: a source task's partitions
are its workload in the abstraction; plans move them between tasks live (their
positions travelling with them), scale the source out and in, and a recovery gives each
partition back its checkpointed position wherever it is read now. The output is the
reference: every record once."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jobs_for_tests import (
    GrowingSource,
    count,
    counts_reference,
    growing_submission,
    identity,
    running_counts,
)

from controlplane.abstraction import (
    AssignResource,
    AssignWorkload,
    InvalidPlan,
    PartitionConflict,
    Plan,
    TaskStillOwnsWork,
    apply_plan,
)
from controlplane.coordinator.checkpoint_report import CheckpointPolicy
from controlplane.statuses import JobStatus
from controlplane.testing import BackgroundCluster
from runtime import Dataflow
from runtime.dataflow import JobGraph
from runtime.partitioned import PartitionSetReader, SourceStalled
from runtime.sinks import Collect, read_parts
from runtime.sources import PartitionedGenerator
from tests.api_support import free_port, wait_until
from tests.faults_support import Events

WAIT_S = 120.0
SOURCE = PartitionedGenerator(records=60_000, rate=6_000, keys=200, seed=5, partitions_count=6)


def counts_to(path: Path) -> JobGraph:
    return running_counts("partitioned_counts", SOURCE, str(path))


def reference() -> list[tuple[str, int]]:
    return counts_reference(SOURCE.open_partition(p, 0.0) for p in SOURCE.partitions())


def partitions_of(job: Any) -> dict[str, list[str]]:
    src = job.abstraction.operator("src")
    return {t.id: list(t.workload.partitions) for t in src.tasks}


def apply(cluster: BackgroundCluster, job: Any, *ops: Any) -> Any:
    plan = Plan(job.abstraction.version, tuple(ops))
    report = cluster.call(cluster.coordinator.apply_plan(job.id, plan))
    assert report.status == "completed", report.error
    return report


def test_a_worker_lists_the_partitions_when_the_job_is_submitted(
    faults: BackgroundCluster, tmp_path: Path
) -> None:
    graph = counts_to(tmp_path)
    assert graph.operator("src").partitions == ()  # the control plane runs no job code
    job = faults.call(faults.coordinator.submit(graph))
    try:
        assert job.graph.operator("src").partitions == ("p0", "p1", "p2", "p3", "p4", "p5")
        assert partitions_of(job) == {"src-0": ["p0", "p2", "p4"], "src-1": ["p1", "p3", "p5"]}
    finally:
        faults.call(faults.coordinator.stop_job(job.id))


def test_partitions_move_live_and_the_source_scales_out_and_in(
    faults: BackgroundCluster, fault_events: Events, tmp_path: Path
) -> None:
    cluster, out = faults, tmp_path / "out"
    job = cluster.call(cluster.coordinator.submit(counts_to(out)))
    assert partitions_of(job) == {"src-0": ["p0", "p2", "p4"], "src-1": ["p1", "p3", "p5"]}
    # One partition moves from src-0 to src-1.
    apply(
        cluster,
        job,
        AssignWorkload("src", {"src-0": ["p0", "p2"], "src-1": ["p1", "p3", "p4", "p5"]}),
    )
    assert partitions_of(job) == {"src-0": ["p0", "p2"], "src-1": ["p1", "p3", "p4", "p5"]}
    # A third source task on the other worker, given two partitions.
    worker = job.layout.placement["src-0"]
    apply(
        cluster,
        job,
        AssignResource("src", "src-2", worker),
        AssignWorkload("src", {"src-1": ["p1", "p3"], "src-2": ["p4", "p5"]}),
    )
    assert partitions_of(job)["src-2"] == ["p4", "p5"]
    # And back to two: src-2 hands its partitions over, then goes.
    apply(
        cluster,
        job,
        AssignWorkload("src", {"src-0": ["p0", "p2", "p4", "p5"], "src-2": []}),
        AssignResource("src", "src-2", None),
    )
    assert cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    assert sorted((k, n) for k, n in read_parts(out)) == reference()


def test_plans_that_lose_or_invent_a_partition_are_refused(
    faults: BackgroundCluster, fault_events: Events, tmp_path: Path
) -> None:
    cluster = faults
    job = cluster.call(cluster.coordinator.submit(counts_to(tmp_path / "out")))
    try:
        base = job.abstraction
        with pytest.raises(
            PartitionConflict, match=r"p4 of operator 'src' would be read by no task"
        ):
            apply_plan(base, Plan(base.version, (AssignWorkload("src", {"src-0": ["p0", "p2"]}),)))
        with pytest.raises(PartitionConflict, match=r"has no partition 'p9'"):
            apply_plan(
                base,
                Plan(base.version, (AssignWorkload("src", {"src-0": ["p0", "p2", "p4", "p9"]}),)),
            )
        with pytest.raises(PartitionConflict, match=r"'p1' of operator 'src' is read by both"):
            apply_plan(
                base,
                Plan(base.version, (AssignWorkload("src", {"src-0": ["p0", "p1", "p2", "p4"]}),)),
            )
        with pytest.raises(TaskStillOwnsWork, match=r"src-1.*still reads partition"):
            apply_plan(base, Plan(base.version, (AssignResource("src", "src-1", None),)))
        with pytest.raises(InvalidPlan, match=r"assign it partitions"):
            apply_plan(base, Plan(base.version, (AssignWorkload("src", {"src-0": 1.0}),)))
    finally:
        cluster.call(cluster.coordinator.stop_job(job.id))


def test_a_recovery_gives_each_partition_its_position_wherever_it_is_read(
    faults: BackgroundCluster, fault_events: Events, tmp_path: Path
) -> None:
    cluster, events, out = faults, fault_events, tmp_path / "out"
    co = cluster.coordinator
    policy = CheckpointPolicy(interval_s=0.2, timeout_s=60, retained=2)
    job = cluster.call(co.submit(counts_to(out), checkpoints=policy))
    events.wait("a checkpoint", lambda: events.completed(job.id) >= 1)
    moved = {"src-0": ["p0"], "src-1": ["p1", "p2", "p3", "p4", "p5"]}
    apply(cluster, job, AssignWorkload("src", moved))
    version = job.abstraction.version
    events.wait("a checkpoint after the move", lambda: events.completed(job.id, version) >= 1)
    os.kill(co.workers[job.layout.placement["count-1"]].pid, signal.SIGKILL)
    events.wait("a recovery", lambda: bool(events.recoveries))
    assert cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    assert sorted((k, n) for k, n in read_parts(out)) == reference()


def test_source_tasks_report_each_partition_s_lag_and_health(
    faults: BackgroundCluster, tmp_path: Path
) -> None:
    cluster = faults
    job = cluster.call(cluster.coordinator.submit(counts_to(tmp_path / "out")))
    reported: dict[str, dict[str, Any]] = {}

    def both_sources_reported() -> bool:
        for _t, task, snap in list(job.metrics.samples):
            if task.startswith("src-") and "partitions" in snap:
                reported[task] = snap["partitions"]
        return len(reported) == 2

    try:
        wait_until(both_sources_reported, WAIT_S, "both source tasks' partitions in metrics")
    finally:
        cluster.call(cluster.coordinator.stop_job(job.id))
    assert sorted(reported["src-0"]) == ["p0", "p2", "p4"]
    assert sorted(reported["src-1"]) == ["p1", "p3", "p5"]
    for health in [*reported["src-0"].values(), *reported["src-1"].values()]:
        assert health["stalled"] is None
        assert isinstance(health["lag"], int) and health["lag"] >= 0  # a throttled generator


class Acknowledging(PartitionedGenerator):
    """A partitioned generator whose readers record what was acknowledged to them."""

    def open_partition(self, partition: str, start_time: float) -> Any:
        reader = super().open_partition(partition, start_time)
        reader.acknowledged = []  # type: ignore[attr-defined]
        reader.committed = reader.acknowledged.append  # type: ignore[method-assign]
        return reader


def test_a_completed_checkpoint_is_acknowledged_to_each_partition_s_reader() -> None:
    source = Acknowledging(records=5000, keys=10, seed=1, partitions_count=2)
    reader = PartitionSetReader(source, ["p0", "p1"], 0.0)
    reader.poll(1e12, 100)
    at_checkpoint = reader.position()
    reader.committed(at_checkpoint)
    for p in ("p0", "p1"):
        assert reader._readers[p].acknowledged == [at_checkpoint[p]]


def test_a_partition_found_while_the_job_runs_is_given_to_a_task_and_read_once(
    faults: BackgroundCluster, tmp_path: Path
) -> None:
    cluster, out = faults, tmp_path / "out"
    listing = tmp_path / "partitions"
    listing.write_text("3")
    source = GrowingSource(
        records=20_000, rate=2_000, keys=100, seed=8, partitions_count=4, listing=str(listing)
    )
    job = cluster.call(cluster.coordinator.submit(running_counts("growing", source, str(out))))
    assert partitions_of(job) == {"src-0": ["p0", "p2"], "src-1": ["p1"]}
    written = tmp_path / "partitions.new"
    written.write_text("4")
    written.replace(listing)  # at once: the source's first task lists it at its next look
    read = lambda: {p for ps in partitions_of(job).values() for p in ps}  # noqa: E731
    wait_until(lambda: "p3" in read(), WAIT_S, "p3 given to a task")
    assert partitions_of(job) == {"src-0": ["p0", "p2"], "src-1": ["p1", "p3"]}
    (added,) = [r for r in job.reconfigurations if isinstance(r.plan, Plan) and r.plan.discovered]
    assert added.plan.discovered == {"src": ("p3",)} and added.status == "completed"
    assert cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    want = counts_reference(source.open_partition(f"p{i}", 0.0) for i in range(4))
    assert sorted((k, n) for k, n in read_parts(out)) == want


def test_over_rest_a_found_partition_is_a_recorded_reconfiguration_with_origin_discovery(
    api: Any, tmp_path: Path
) -> None:
    listing = tmp_path / "partitions"
    with api.running_job(growing_submission(listing, 2, 3)) as job, api.client() as http:
        src = http.get(f"/api/v1/jobs/{job}/abstraction").json()["operators"][0]
        assert [t["workload"] for t in src["tasks"]] == [
            {"partitions": ["p0"]},
            {"partitions": ["p1"]},
        ]
        written = tmp_path / "partitions.new"
        written.write_text("3")
        written.replace(listing)  # at once: a reader never sees it half written

        def discovered() -> dict[str, Any] | None:
            items = http.get(f"/api/v1/jobs/{job}/reconfigurations").json()["items"]
            done = [i for i in items if i["origin"] == "discovery" and i["status"] == "completed"]
            return done[0] if done else None

        rec = wait_until(discovered, WAIT_S, "a completed discovery reconfiguration")
        assert rec["discovered"] == {"src": ["p2"]}
        assert rec["ops"] == [
            {"op": "assignWorkload", "operator": "src", "workload": {"src-0": ["p0", "p2"]}}
        ]
        src = http.get(f"/api/v1/jobs/{job}/abstraction").json()["operators"][0]
        assert [t["workload"] for t in src["tasks"]] == [
            {"partitions": ["p0", "p2"]},
            {"partitions": ["p1"]},
        ]


def test_over_rest_a_source_that_cannot_list_its_partitions_refuses_the_job_naming_it(
    api: Any, tmp_path: Path
) -> None:
    port = free_port()  # nothing listens there
    body = {
        "name": "unreachable",
        "job": "tests.jobs_for_tests:build_from_redis",
        "params": {"url": f"redis://127.0.0.1:{port}/0"},
    }
    with api.client() as http:
        r = http.post("/api/v1/jobs", json=body)
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["code"] == "bad_source"
        assert "source 'src' cannot list its partitions" in error["message"]
        assert f"127.0.0.1:{port}" in error["message"]
        listed = http.get("/api/v1/jobs", params={"limit": 500}).json()["items"]
        assert not [j for j in listed if j["name"] == "unreachable"]  # nothing submitted


@dataclass(frozen=True, kw_only=True)
class Unreachable(PartitionedGenerator):
    """A partitioned generator whose partition p1 cannot be read: its reader is stalled."""

    stall_timeout_s: float | None = 0.0

    def open_partition(self, partition: str, start_time: float) -> Any:
        reader = super().open_partition(partition, start_time)
        if partition == "p1":
            reader.stalled = "cannot reach the broker at 127.0.0.1:9 (retrying)"
            reader.poll = lambda now, most: ([], [])  # type: ignore[method-assign]
        return reader


def test_a_partition_stalled_past_its_timeout_fails_its_task_naming_it() -> None:
    reader = PartitionSetReader(Unreachable(keys=5, seed=1, partitions_count=2), ["p0", "p1"], 0.0)
    assert reader.health()["p1"]["stalled"].startswith("cannot reach the broker")
    with pytest.raises(SourceStalled, match=r"partition 'p1' could not be read .*127.0.0.1:9"):
        for _ in range(1_000_000):  # until the monotonic clock has moved past 0 s
            reader.poll(1e12, 10)
    patient = PartitionSetReader(
        Unreachable(keys=5, seed=1, partitions_count=2, stall_timeout_s=None), ["p1"], 0.0
    )
    for _ in range(1000):
        assert patient.poll(1e12, 10) == ([], [])  # never: it waits for the broker


def test_over_rest_a_stalled_partition_makes_an_event_and_another_when_it_reads_again(
    api: Any, tmp_path: Path
) -> None:
    gate = tmp_path / "broker-down"
    gate.touch()
    body = {
        "name": "gated",
        "job": "tests.jobs_for_tests:build_gated",
        "params": {"gate": str(gate)},
        "checkpoints": {"interval_s": None},
    }
    with api.running_job(body) as job, api.client() as http:

        def event(kind: str) -> dict[str, Any] | None:
            items = http.get("/api/v1/events", params={"job_id": job, "limit": 100}).json()
            found = [e for e in items["items"] if e["kind"] == kind]
            return found[0] if found else None

        stalled = wait_until(lambda: event("source.stalled"), WAIT_S, "source.stalled")
        assert stalled["data"]["partition"] == "p1" and stalled["data"]["operator"] == "src"
        assert "broker-down exists" in stalled["message"]
        gate.unlink()
        resumed = wait_until(lambda: event("source.resumed"), WAIT_S, "source.resumed")
        assert resumed["data"] == {"operator": "src", "partition": "p1", "stalled": None}


def test_a_bounded_source_task_without_partitions_idles_until_the_others_end(
    faults: BackgroundCluster, fault_events: Events, tmp_path: Path
) -> None:
    """Three source tasks for two partitions: the third reads nothing, yet checkpoints go
    on (it has not finished) and, once the two others have, it ends and the job too."""
    source = PartitionedGenerator(records=12_000, rate=4_000, keys=50, seed=6, partitions_count=2)
    out = tmp_path / "out"
    flow = Dataflow("idle_source_task")
    src = flow.source("src", source, parallelism=3)
    src.key_by(identity).process("count", count, parallelism=2).sink(
        "out", Collect(str(out)), parallelism=2
    )
    policy = CheckpointPolicy(interval_s=0.2, timeout_s=60, retained=2)
    job = faults.call(faults.coordinator.submit(flow.compile(), checkpoints=policy))
    assert partitions_of(job)["src-2"] == []
    fault_events.wait("2 checkpoints", lambda: fault_events.completed(job.id) >= 2)
    assert faults.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    want = counts_reference(source.open_partition(p, 0.0) for p in source.partitions())
    assert sorted((k, n) for k, n in read_parts(out)) == want


@dataclass(frozen=True, kw_only=True)
class Deleted(PartitionedGenerator):
    """A partitioned generator whose partition p1 cannot be opened (deleted meanwhile)."""

    def open_partition(self, partition: str, start_time: float) -> Any:
        if partition == "p1":
            raise LookupError("partition p1 was deleted")
        return super().open_partition(partition, start_time)


def test_a_source_task_that_cannot_open_a_partition_fails_the_job_not_its_worker(
    faults: BackgroundCluster, tmp_path: Path
) -> None:
    source = Deleted(records=None, rate=500, keys=5, seed=1, partitions_count=2)
    alive = {w.id for w in faults.coordinator.alive_workers()}
    job = faults.call(faults.coordinator.submit(running_counts("deleted", source, str(tmp_path))))
    assert faults.wait(job, WAIT_S) == JobStatus.FAILED
    assert "task 'src-1' could not start: LookupError: partition p1 was deleted" in (
        job.error or ""
    )
    assert {w.id for w in faults.coordinator.alive_workers()} == alive  # every worker lives on
