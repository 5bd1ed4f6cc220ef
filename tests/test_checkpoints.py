"""Checkpoints of running jobs, end to end: real workers, a real store, real barriers.

A checkpoint must be a consistent cut: the state it holds is exactly what the records
before the sources' recorded positions made. These tests check that by replaying each
source from its start up to the position the checkpoint holds, counting, and comparing
with the key groups read back from the store (every chain materialized).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from jobs_for_tests import count, identity

from controlplane.coordinator.checkpoint_report import CheckpointPolicy, CheckpointReport
from controlplane.statuses import CheckpointStatus
from controlplane.testing import BackgroundCluster
from runtime import Dataflow
from runtime.checkpoints.snapshot import materialize
from runtime.checkpoints.store import CheckpointStore, open_store
from runtime.dataflow import JobGraph
from runtime.layout import Layout
from runtime.sinks import Null
from runtime.sources import Generator

WAIT_S = 120.0  # no wait of these tests lasts longer (a loaded machine is slow, not stuck)


class Reports:
    """The checkpoint reports of the jobs a test runs, as the coordinator tells them."""

    def __init__(self) -> None:
        self.items: list[tuple[str, CheckpointReport | int]] = []
        self._cond = threading.Condition()

    def __call__(self, job_id: str, what: CheckpointReport | int) -> None:
        with self._cond:
            self.items.append((job_id, what))
            self._cond.notify_all()

    def of(self, job_id: str, status: CheckpointStatus | None = None) -> list[CheckpointReport]:
        with self._cond:
            return [
                r
                for j, r in self.items
                if j == job_id
                and isinstance(r, CheckpointReport)
                and (status is None or r.status == status)
            ]

    def wait(self, what: str, condition: Callable[[], bool]) -> None:
        with self._cond:
            assert self._cond.wait_for(condition, WAIT_S), f"no {what} within {WAIT_S:.0f}s"

    def completed(self, job_id: str, n: int) -> list[CheckpointReport]:
        self.wait(
            f"{n} completed checkpoints of {job_id}",
            lambda: len(self.of(job_id, CheckpointStatus.COMPLETED)) >= n,
        )
        return self.of(job_id, CheckpointStatus.COMPLETED)


@pytest.fixture
def reports(cluster: BackgroundCluster) -> Any:
    """A listener of the shared cluster's checkpoints for one test."""
    listener = Reports()
    co = cluster.coordinator
    co.on_checkpoint = listener
    yield listener
    co.on_checkpoint = None


def store_of(cluster: BackgroundCluster) -> CheckpointStore:
    return open_store(cluster.coordinator.config.checkpoint_store)


def counts_job(rate: float, keys: int = 2000, records: int | None = None) -> JobGraph:
    flow = Dataflow("checkpointed_counts")
    src = flow.source(
        "src", Generator(records=records, rate=rate, keys=keys, seed=7), parallelism=2
    )
    src.key_by(identity).process("count", count, parallelism=2).sink("out", Null())
    return flow.compile()


def manifest(store: CheckpointStore, report: CheckpointReport) -> dict:
    assert report.path is not None
    return msgpack.unpackb(store.get(report.path), strict_map_key=False)


def state_in(store: CheckpointStore, man: dict, op: str) -> dict[int, dict]:
    """Every key group of operator ``op`` in checkpoint ``man``, materialized from its
    chain; a group held by two tasks fails the test."""
    groups: dict[int, dict] = {}
    for task, part in man["tasks"].items():
        if task.rpartition("-")[0] != op:
            continue
        for g, chain in part["groups"].items():
            assert g not in groups, f"key group {g} is in two tasks' parts"
            groups[g] = materialize(store.get_range(p, off, n) for p, off, n, _f, _k in chain)
    return groups


def replayed(graph: JobGraph, man: dict) -> Counter:
    """What each key counts to once every source task has emitted up to the position
    checkpoint ``man`` holds for it: the records are replayed from the start."""
    src = graph.operator("src")
    total: Counter = Counter()
    for task, part in man["tasks"].items():
        if task.rpartition("-")[0] != "src":
            continue
        index = int(task.rpartition("-")[2])
        reader = src.logic.open(index, src.parallelism, 0.0)
        goal = part["position"]
        assert isinstance(goal, int)
        while reader.position() != goal:
            polled = reader.poll(1e12, 1)
            assert polled is not None, f"{task} ended before position {goal}"
            total.update(polled[0])
        reader.close()
    return total


def assert_consistent(store: CheckpointStore, graph: JobGraph, report: CheckpointReport) -> None:
    man = manifest(store, report)
    groups = state_in(store, man, "count")
    assert sorted(groups) == list(range(graph.operator("count").max_parallelism))
    state = {k: v for g in groups.values() for k, v in g.items()}
    assert state == dict(replayed(graph, man))


def test_checkpoints_are_consistent_incremental_and_retained(
    cluster: BackgroundCluster, reports: Reports
) -> None:
    graph = counts_job(rate=4000)
    policy = CheckpointPolicy(interval_s=0.2, timeout_s=60, retained=2, full_every=3)
    job = cluster.call(cluster.coordinator.submit(graph, checkpoints=policy))
    done = reports.completed(job.id, 6)
    store = store_of(cluster)
    first, *later = done
    # The first one writes every key group whole; later ones what changed, and less.
    assert first.bytes == first.full_bytes > 0
    assert any(r.bytes < r.full_bytes for r in later)
    assert all(r.version == 1 and r.tasks == len(job.layout.placement) for r in done), done
    for r in (done[-1], done[-2]):
        assert_consistent(store, graph, r)
    # Retention: only what the two retained checkpoints refer to, and newer ones, remain.
    latest = done[-1].id
    kept: set[int] = set()
    for r in done[-2:]:
        for part in manifest(store, r)["tasks"].values():
            for chain in part["groups"].values():
                kept |= {int(p.split("/")[1][4:]) for p, *_ in chain}
    present = {int(p.split("/")[1][4:]) for p in store.list(job.id)}
    assert {c for c in present if c <= latest} <= kept | {latest}
    discarded = [r for j, r in reports.items if j == job.id and isinstance(r, int)]
    assert discarded and set(discarded) <= {r.id for r in done[:-2]}
    cluster.call(cluster.coordinator.stop_job(job.id))


def test_live_reconfigurations_and_checkpoints_take_turns_and_every_cut_stays_consistent(
    cluster: BackgroundCluster, reports: Reports
) -> None:
    graph = counts_job(rate=4000)
    policy = CheckpointPolicy(interval_s=0.05, timeout_s=60, retained=3, full_every=2)
    co = cluster.coordinator
    job = cluster.call(co.submit(graph, checkpoints=policy))
    store = store_of(cluster)
    reports.completed(job.id, 1)
    for step in range(4):
        before = len(reports.of(job.id, CheckpointStatus.COMPLETED))
        layout: Layout = job.layout
        frm, to = ("count-0", "count-1") if step % 2 == 0 else ("count-1", "count-0")
        moved = list(layout.assignment[frm][: len(layout.assignment[frm]) // 2])
        a = dict(layout.assignment)
        a[frm] = tuple(g for g in a[frm] if g not in moved)
        a[to] = tuple(sorted(set(a[to]) | set(moved)))
        report = cluster.call(co.reconfigure(job.id, layout.replace(assignment=a)))
        assert report.status == "completed", report.error
        after = reports.completed(job.id, before + 2)
        assert_consistent(store, graph, after[-1])
    cluster.call(co.stop_job(job.id))


def test_a_checkpoint_that_times_out_is_abandoned_and_the_job_goes_on(
    cluster: BackgroundCluster, reports: Reports
) -> None:
    graph = counts_job(rate=20_000, records=40_000)
    policy = CheckpointPolicy(interval_s=0.05, timeout_s=1e-4, retained=1)
    job = cluster.call(cluster.coordinator.submit(graph, checkpoints=policy))
    reports.wait(
        "an abandoned checkpoint", lambda: bool(reports.of(job.id, CheckpointStatus.ABANDONED))
    )
    abandoned = reports.of(job.id, CheckpointStatus.ABANDONED)[0]
    assert "not complete within" in (abandoned.error or "")
    assert cluster.wait(job, WAIT_S) == "finished", job.error
    assert job.summary()["sink_records"] == 40_000


def hold_a_lock(key: Any, value: Any, state: Any) -> tuple:
    """A UDF whose state cannot be pickled."""
    state.set(threading.Lock())
    return ()


def test_state_that_cannot_be_captured_abandons_the_checkpoint_with_a_clear_cause(
    cluster: BackgroundCluster, reports: Reports
) -> None:
    flow = Dataflow("unpicklable_state")
    src = flow.source("src", Generator(records=None, rate=2000, keys=50, seed=1))
    src.key_by(identity).process("lock", hold_a_lock, parallelism=1).sink("out", Null())
    policy = CheckpointPolicy(interval_s=0.1, timeout_s=60)
    job = cluster.call(cluster.coordinator.submit(flow.compile(), checkpoints=policy))
    reports.wait(
        "an abandoned checkpoint", lambda: bool(reports.of(job.id, CheckpointStatus.ABANDONED))
    )
    error = reports.of(job.id, CheckpointStatus.ABANDONED)[0].error or ""
    assert "lock-0" in error and "lock" in error.lower()
    assert job.status == "running"
    cluster.call(cluster.coordinator.stop_job(job.id))
