"""The windowed aggregation whose hot keys split (``window_aggregate``) on real worker
processes: it gives the windows ``window`` gives, and stays exact while its hot key is
split over several tasks, merged back, and its parts' key groups move (rebalance, scale,
migrate; pause and fluid), and through a worker killed under checkpoints while the key
is split."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest

from controlplane.abstraction import split_key
from controlplane.statuses import JobStatus
from controlplane.testing import BackgroundCluster
from runtime.dataflow import load_job
from tests import faults_support
from tests.api_support import wait_until
from tests.test_aggregate_split import split_then_random_plans, split_three_ways_then_merge_back
from tests.test_windows_e2e import event_time_of
from tests.time_jobs import read_windows
from tests.window_split_jobs import HOT, reference

pytestmark = pytest.mark.slow

WAIT_S = 120.0  # a bounded job of these sizes ends within this on the busiest machine
JOB = "tests.window_split_jobs:split_window_job"


@pytest.mark.parametrize("window", ["tumbling", "sliding"])
def test_window_aggregate_gives_the_windows_window_gives(
    cluster: BackgroundCluster, tmp_path: Path, window: str
) -> None:
    """Out-of-order events (up to 300 ms), half of them of one key: the same windows,
    each once and exact, as ``window(..., aggregate=)`` and the reference."""
    params = {"events": 6_000, "window": window}
    got = {}
    for plain in (False, True):
        out = tmp_path / ("plain" if plain else "split")
        job = cluster.run(
            load_job(JOB, {**params, "plain": plain, "output": str(out)}), timeout=WAIT_S
        )
        assert job.status == "finished", job.error
        got[plain] = read_windows(str(out))
    assert got[False] == got[True] == reference(params)


def test_a_hot_key_split_over_three_tasks_is_windowed_by_each_and_merged_exactly(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """Split the hot key over the three partial tasks: each takes a share of its records
    into its part's key group; merged back, the parts' open windows still fire; every
    window is exact."""
    params = {"events": 20_000, "rate": 2_500, "parallelism": 3, "output": str(tmp_path)}
    job = cluster.submit(load_job(JOB, {**params, "held": str(held_end)}))
    try:
        wait_until(lambda: job.done or event_time_of(job, "window-0"), WAIT_S, "a watermark")
        split_three_ways_then_merge_back(cluster, job, "window", HOT, 1_000)
    finally:
        held_end.unlink()
    assert cluster.wait(job, WAIT_S) == "finished", job.error
    assert read_windows(str(tmp_path)) == reference(params)


def run_random_plans(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path, seed: int, window: str
) -> None:
    """The hot key split 2 ways, then six random plans while windows are open; every
    (key, window) once, exact."""
    params = {"events": 20_000, "rate": 2_500, "window": window, "output": str(tmp_path)}
    job = cluster.submit(load_job(JOB, {**params, "held": str(held_end)}))
    try:
        wait_until(lambda: job.done or event_time_of(job, "window-0"), WAIT_S, "a watermark")
        applied = split_then_random_plans(cluster, job, random.Random(seed), HOT, "window")
    finally:
        held_end.unlink()
    assert cluster.wait(job, WAIT_S) == "finished", job.error
    assert read_windows(str(tmp_path)) == reference(params), applied


@pytest.mark.parametrize("seed,window", [(1, "tumbling"), (2, "sliding")])
def test_a_split_key_stays_exact_through_random_live_plans(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path, seed: int, window: str
) -> None:
    """Splits, merges back, and key-group moves of the split key's parts in any order."""
    run_random_plans(cluster, tmp_path, held_end, seed, window)


def test_a_worker_killed_while_a_key_is_split_leaves_the_windows_exact(
    fault_events: faults_support.Events, faults: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """The split key's parts (windows and timers) are checkpointed in their key groups
    and come back with the recovery; the split is part of the version recovered."""
    params = {"events": 20_000, "rate": 2_500, "window": "sliding", "output": str(tmp_path)}
    graph = load_job(JOB, {**params, "held": str(held_end)})
    job, _used, _spare = faults_support.start_job(faults, fault_events, graph)
    rec = faults.call(
        faults.coordinator.apply_plan(job.id, split_key(job.abstraction, "window", HOT, 2))
    )
    assert rec.status == "completed", rec.error
    # Taken in the split's version: one captured before the change may complete after it.
    split = job.abstraction.version
    fault_events.wait("a checkpoint of the split", lambda: fault_events.completed(job.id, split))
    victim = job.layout.placement["window-1"]
    os.kill(faults.coordinator.workers[victim].pid, signal.SIGKILL)
    fault_events.wait("a recovery", lambda: bool(fault_events.recoveries))
    report, _version = fault_events.recoveries[0]
    assert report.status == "completed", report.error
    assert HOT in job.abstraction.operator("window").splits()
    held_end.unlink()
    assert faults.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    assert read_windows(str(tmp_path)) == reference(params)
