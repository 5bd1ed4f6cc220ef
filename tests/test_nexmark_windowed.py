"""The Nexmark queries on event time (q3, q4, q5, q7, q8, q11) on real local workers: each
job's output is its reference exactly, on out-of-order streams; q5, q8 and q11 also
through random live plans on their stateful operator and a source partition moved, and
q11 through a worker SIGKILLed under checkpoints."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

from controlplane.abstraction import AssignWorkload, Plan
from controlplane.statuses import JobStatus
from controlplane.testing import BackgroundCluster
from examples.nexmark import windowed
from examples.nexmark.queries import JOBS, output_rows, reference
from tests import faults_support
from tests.api_support import wait_until
from tests.test_nexmark_queries import held_graph
from tests.test_windows_e2e import event_time_of, random_plan

pytestmark = pytest.mark.slow

WAIT_S = 120.0  # hang guard for a job's run, or a plan's, on a loaded machine
PLANS = 5  # random live plans per run, besides the partition moved

# 200 events per second of event time: 20,000 events span 100 s, many windows of 10 s.
# Groups of 10 events are shuffled: the watermark trails by 45 ms.
STREAM = {"event_rate": 200, "out_of_order_group_size": 10, "partitions": 4}


@pytest.mark.parametrize("query", sorted(windowed.BUILDERS))
def test_the_event_time_job_s_output_is_the_reference(
    cluster: BackgroundCluster, tmp_path: Path, query: str
) -> None:
    params = {**STREAM, "events": 20_000, "seed": 3, "output": str(tmp_path)}
    job = cluster.run(JOBS[query](params).compile(), timeout=WAIT_S)
    assert job.status == JobStatus.FINISHED, job.error
    assert output_rows(query, tmp_path) == reference(query, params)


def move_a_partition(job: Any) -> Plan:
    """A plan moving one partition of ``events`` from its first task to the other."""
    a = job.abstraction
    reading = {t.id: list(t.workload.partitions) for t in a.operator("events").tasks}
    first, other = sorted(reading)
    moved = reading[first][0]
    after = {first: reading[first][1:], other: [*reading[other], moved]}
    return Plan(a.version, (AssignWorkload("events", after),))


def apply(cluster: BackgroundCluster, job: Any, kind: str, plan: Plan) -> None:
    report = cluster.call(cluster.coordinator.apply_plan(job.id, plan), timeout=WAIT_S)
    assert report.status == "completed", f"{kind}: {report.error}"


@pytest.mark.parametrize("query,seed", [("q5", 1), ("q8", 2), ("q11", 3)])
def test_the_event_time_job_stays_exact_through_random_live_plans(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path, query: str, seed: int
) -> None:
    """While events flow, a partition of the source moves to the other task, then the
    query's stateful operator goes through random plans (rebalance, rescale, migration,
    each in pause or fluid mode): windows, buffered join sides and their timers move
    with their key groups; every row comes once."""
    params = {**STREAM, "events": 24_000, "rate": 4_000.0, "seed": seed, "output": str(tmp_path)}
    op = windowed.STATEFUL[query]
    job = cluster.submit(held_graph(query, params, held_end))
    rng = random.Random(seed)
    applied = []
    try:
        wait_until(lambda: job.done or event_time_of(job, f"{op}-0"), WAIT_S, "a watermark")
        assert not job.done, job.error
        apply(cluster, job, "partition", move_a_partition(job))
        applied.append("partition")
        while len(applied) <= PLANS:
            kind, plan = random_plan(rng, job.abstraction, op, "events")
            if kind == "partition" or not plan.ops:
                continue
            apply(cluster, job, kind, plan)
            applied.append(kind)
    finally:
        held_end.unlink()
    assert cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    assert output_rows(query, tmp_path) == reference(query, params), applied


def test_sessions_stay_exact_through_a_worker_killed_under_checkpoints(
    fault_events: faults_support.Events, faults: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """q11's sessions and their timers are checkpointed with their key groups: a worker
    SIGKILLed while sessions are open, the job recovers (sources rewound, watermarks
    regenerated) and every session is emitted once, exact (the sink commits with
    checkpoints)."""
    params = {**STREAM, "events": 24_000, "rate": 4_000.0, "seed": 4, "output": str(tmp_path)}
    graph = held_graph("q11", params, held_end)
    job, _used, _spare = faults_support.start_job(faults, fault_events, graph)
    victim = job.layout.placement["sessions-1"]
    os.kill(faults.coordinator.workers[victim].pid, signal.SIGKILL)
    fault_events.wait("a recovery", lambda: bool(fault_events.recoveries))
    report, _version = fault_events.recoveries[0]
    assert report.status == "completed", report.error
    held_end.unlink()
    assert faults.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    assert output_rows("q11", tmp_path) == reference("q11", params)
