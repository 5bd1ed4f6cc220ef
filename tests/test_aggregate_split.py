"""Combinable aggregations on real worker processes: a running count equals its reference,
and stays exact while a hot key is split over several tasks, merged back, split again
while its key groups move (pause and fluid), and through a worker killed under
checkpoints while the key is split."""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from controlplane.abstraction import NoChange, Plan, migrate, rebalance, scale, split_key
from controlplane.testing import BackgroundCluster
from examples import wordcount
from tests import faults_support
from tests.api_support import wait_until
from tests.e2e_jobs import held_wordcount

pytestmark = pytest.mark.slow

WAIT_S = 120.0  # a bounded job of these sizes ends within this on the busiest machine
PARAMS = {"records": 20_000, "words": 8, "keys": 500, "zipf": 2.0, "aggregate": True}


def params(tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {**PARAMS, "output": str(tmp_path / "out"), **more}


def hottest(p: dict[str, Any]) -> str:
    return Counter(wordcount.reference(p)).most_common(1)[0][0]


def counted_by(job: Any, operator: str) -> dict[str, int]:
    """Records each task of ``operator`` took in so far (from the run's totals)."""
    totals = job.metrics.records_in
    return {t: n for t, n in totals.items() if t.rpartition("-")[0] == operator}


def group_counts(job: Any, operator: str, since: float) -> Counter[int]:
    """Records per key group of ``operator`` in the snapshots that arrived after ``since``."""
    counts: Counter[int] = Counter()
    for t, task, snap in list(job.metrics.samples):
        if t >= since and task.rpartition("-")[0] == operator:
            counts.update({int(g): int(n) for g, n in (snap.get("key_groups") or {}).items()})
    return counts


def test_an_aggregate_counts_every_word_once(cluster: BackgroundCluster, tmp_path: Path) -> None:
    p = params(tmp_path)
    job = cluster.submit(wordcount.build(p).compile())
    assert cluster.wait(job, WAIT_S) == "finished", job.error
    assert wordcount.read_results(p["output"]) == wordcount.reference(p)


def test_a_hot_key_split_over_three_tasks_is_counted_by_each_and_merged_exactly(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """Split the hottest word over the three count tasks: each of them takes a share of
    its records from then on; merged back, only its owner does; the counts are exact."""
    p = params(tmp_path, parallelism=3, rate=4_000)
    job = cluster.submit(held_wordcount({**p, "held": str(held_end)}))
    hot = hottest(p)
    try:
        wait_until(lambda: job.done or sum(counted_by(job, "count").values()) > 0, WAIT_S, "input")
        split_three_ways_then_merge_back(cluster, job, "count", hot, 2_000)
    finally:
        held_end.unlink()
    assert cluster.wait(job, WAIT_S) == "finished", job.error
    del p["rate"]
    assert wordcount.read_results(p["output"]) == wordcount.reference(p)


def split_three_ways_then_merge_back(
    cluster: BackgroundCluster, job: Any, name: str, hot: Any, records: int
) -> None:
    """Split ``hot`` of the combinable operator ``name`` over three tasks, wait until each
    part's key group takes a share of its records (the key's home group more than
    ``records`` since the split, every other part more than half as many as the home),
    then merge it back."""
    rec = cluster.call(
        cluster.coordinator.apply_plan(job.id, split_key(job.abstraction, name, hot, 3))
    )
    assert rec.status == "completed", rec.error
    parts = job.abstraction.operator(name).splits()[hot]
    assert len(parts) == 3
    home, others = parts[0], parts[1:]
    since = time.time()
    # Each part's group takes a third of the hot key's records: about as many as the key's
    # own group (which, before, took them all and the others next to none).
    wait_until(
        lambda: (
            job.done
            or (
                (c := group_counts(job, name, since))[home] > records
                and all(c[g] > c[home] / 2 for g in others)
            )
        ),
        WAIT_S,
        "the split key in each of its parts' groups",
    )
    assert not job.done, job.error
    rec = cluster.call(
        cluster.coordinator.apply_plan(job.id, split_key(job.abstraction, name, hot, []))
    )
    assert rec.status == "completed", rec.error
    assert job.abstraction.operator(name).split_keys == ()


def random_plan(rng: random.Random, a: Any, hot: Any, name: str = "count") -> tuple[str, Plan]:
    """Split or merge back the hot key of the combinable operator ``name``, or move its
    key groups (rebalance, rescale, migration), half of the moves fluid."""
    op = a.operator(name)
    split = hot in op.splits()
    kind = rng.choice(["split", "rebalance", "scale", "migrate"])
    if kind == "split":
        if op.parallelism < 2:  # nothing to split over (and no split: scaling in merged it)
            return "scale", scale(a, name, 3)
        ways = 1 if split and rng.random() < 0.5 else rng.randint(2, op.parallelism)
        return f"split {ways} ways", split_key(a, name, hot, ways if ways > 1 else [])
    if kind == "rebalance":
        plan = rebalance(a, name, {g: rng.random() for g in range(op.max_parallelism or 1)})
    elif kind == "scale":
        plan = scale(a, name, rng.choice([n for n in (1, 2, 3) if n != op.parallelism]))
    else:
        task = rng.choice(op.tasks)
        workers = [w.id for w in a.workers if w.status == "alive"]
        plan = migrate(a, task.id, rng.choice([w for w in workers if w != task.worker]))
    if rng.random() < 0.5:
        return f"{kind} (fluid)", replace(plan, mode="fluid", batch_size=rng.choice([8, None]))
    return kind, plan


def split_then_random_plans(
    cluster: BackgroundCluster, job: Any, rng: random.Random, hot: Any, name: str
) -> list[str]:
    """Split ``hot`` of ``name`` 2 ways, then apply six :func:`random_plan` s, each
    completed; returns what they were."""
    first = split_key(job.abstraction, name, hot, 2)
    rec = cluster.call(cluster.coordinator.apply_plan(job.id, first))
    assert rec.status == "completed", rec.error
    applied: list[str] = []
    while len(applied) < 6:
        kind, plan = random_plan(rng, job.abstraction, hot, name)
        if not plan.ops:
            continue
        try:
            rec = cluster.call(cluster.coordinator.apply_plan(job.id, plan))
        except NoChange:  # it drew the split the key has already
            continue
        assert rec.status == "completed", f"{kind}: {rec.error}"
        applied.append(kind)
    return applied


@pytest.mark.parametrize("seed", [1, 2])
def test_a_split_key_stays_exact_through_random_live_plans(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path, seed: int
) -> None:
    """Splits, merges back, and key-group moves of the split key's parts in any order."""
    p = params(tmp_path, parallelism=2, rate=5_000)
    job = cluster.submit(held_wordcount({**p, "held": str(held_end)}))
    hot = hottest(p)
    try:
        wait_until(lambda: job.done or sum(counted_by(job, "count").values()) > 0, WAIT_S, "input")
        applied = split_then_random_plans(cluster, job, random.Random(seed), hot, "count")
    finally:
        held_end.unlink()
    assert cluster.wait(job, WAIT_S) == "finished", job.error
    del p["rate"]
    assert wordcount.read_results(p["output"]) == wordcount.reference(p), applied


def test_a_worker_killed_while_a_key_is_split_leaves_the_counts_exact(
    fault_events: faults_support.Events, faults: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """The split key's parts are checkpointed in their key groups and come back with the
    recovery; the split itself is part of the version recovered."""
    p = params(tmp_path, parallelism=2, rate=5_000)
    graph = held_wordcount({**p, "held": str(held_end)})
    job, _used, _spare = faults_support.start_job(faults, fault_events, graph)
    hot = hottest(p)
    rec = faults.call(
        faults.coordinator.apply_plan(job.id, split_key(job.abstraction, "count", hot, 2))
    )
    assert rec.status == "completed", rec.error
    # Taken in the split's version: one captured before the change may complete after it.
    split = job.abstraction.version
    fault_events.wait("a checkpoint of the split", lambda: fault_events.completed(job.id, split))
    victim = job.layout.placement["count-1"]
    os.kill(faults.coordinator.workers[victim].pid, signal.SIGKILL)
    fault_events.wait("a recovery", lambda: bool(fault_events.recoveries))
    report, _version = fault_events.recoveries[0]
    assert report.status == "completed", report.error
    assert hot in job.abstraction.operator("count").splits()
    faults_support.finish_job(faults, job, held_end)
    del p["rate"]
    assert wordcount.read_results(p["output"]) == wordcount.reference(p)
