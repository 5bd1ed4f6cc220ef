"""Live reconfiguration on real worker processes: results unchanged, aborts, one at a time."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from controlplane.coordinator import ReconfigurationBusy, ReconfigurationError
from controlplane.testing import BackgroundCluster
from examples import wordcount
from runtime.dataflow import load_job
from runtime.layout import Layout
from runtime.sinks import read_parts
from tests.api_support import wait_until
from tests.e2e_jobs import counting_reference, final_counts, held_until_released

pytestmark = pytest.mark.slow

FLOWING_TIMEOUT_S = 60.0  # records reach a new job's sinks within this, however busy the box
POLL_S = 0.01  # how often an async wait looks at its condition again


def sink_records(job) -> int:
    """Records the job's sinks took, as its workers last reported (once a second)."""
    return job.summary()["sink_records"]


def until_flowing(job, at_least: int = 1) -> None:
    """Wait until ``job``'s sinks have taken ``at_least`` records (it runs: records flow)."""
    wait_until(
        lambda: job.done or sink_records(job) >= at_least,
        FLOWING_TIMEOUT_S,
        f"{at_least} records at the sinks of {job.id}",
    )
    assert not job.done, (job.status, job.error)


async def until(condition, what: str, timeout: float = FLOWING_TIMEOUT_S) -> None:
    """Wait (on the event loop) until ``condition()``; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        await asyncio.sleep(POLL_S)


async def flowing(job) -> None:
    """:func:`until_flowing`, on the event loop."""
    await until(lambda: job.done or sink_records(job) > 0, f"records at the sinks of {job.id}")
    assert not job.done, (job.status, job.error)


def submit_running(cluster: BackgroundCluster, ref: str, params: dict, held_end: Path):
    """Submit job ``ref`` with ``params``, its sources' end held back while ``held_end``
    exists (see ``e2e_jobs.held_until_released``), and wait until records flow: it runs
    whatever the machine's speed until :func:`finish` releases it, and the rest of its
    records come unpaced then (``hurry``: the test's changes are made by then)."""
    job = cluster.submit(held_until_released(load_job(ref, params), held_end, hurry=True))
    until_flowing(job)
    return job


def finish(cluster: BackgroundCluster, job, held_end: Path) -> None:
    """Release ``job``'s held-back end: it finishes."""
    held_end.unlink()
    assert cluster.wait(job, 60) == "finished", job.error


def move_groups(layout: Layout, groups: list[int], frm: str, to: str) -> Layout:
    a = dict(layout.assignment)
    a[frm] = tuple(g for g in a[frm] if g not in groups)
    a[to] = tuple(sorted(set(a[to]) | set(groups)))
    return layout.replace(assignment=a)


def test_rebalance_scale_migrate_while_records_flow(
    any_cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    params = {"records": 60_000, "rate": 20_000, "output": str(tmp_path)}
    job = submit_running(any_cluster, "examples.wordcount:build", params, held_end)
    co = any_cluster.coordinator
    records = []
    # Rebalance: half of count-0's key groups to count-1.
    records.append(
        any_cluster.call(
            co.reconfigure(job.id, move_groups(job.layout, list(range(32)), "count-0", "count-1"))
        )
    )
    # Scale count (and its forward sink) out to 3, on worker w1.
    lay = job.layout
    a, p, w = dict(lay.assignment), dict(lay.placement), dict(lay.weights)
    a["count-2"] = tuple(range(100, 128))
    a["count-1"] = tuple(g for g in a["count-1"] if g < 100)
    p["count-2"] = p["sink-2"] = "w1"
    w["sink-2"] = 1.0
    records.append(
        any_cluster.call(co.reconfigure(job.id, lay.replace(assignment=a, placement=p, weights=w)))
    )
    # Migrate count-1 and sink-1 to the other worker.
    lay = job.layout
    p = dict(lay.placement)
    other = "w1" if p["count-1"] == "w2" else "w2"
    p["count-1"] = p["sink-1"] = other
    records.append(any_cluster.call(co.reconfigure(job.id, lay.replace(placement=p))))
    # Scale back in to 2.
    lay = job.layout
    a, p, w = dict(lay.assignment), dict(lay.placement), dict(lay.weights)
    a["count-1"] = tuple(sorted(a["count-1"] + a.pop("count-2")))
    del p["count-2"], p["sink-2"], w["sink-2"]
    records.append(
        any_cluster.call(co.reconfigure(job.id, lay.replace(assignment=a, placement=p, weights=w)))
    )
    for rec in records:
        assert rec.status == "completed", rec.error
        assert set(rec.timings_ms) == {"prepare", "sync", "update", "total"}
        assert rec.pause_ms and set(rec.pause_ms) <= rec.affected
    # Unaffected tasks never paused: the sources are not in any affected set.
    assert all("sentences-0" not in rec.affected for rec in records)
    finish(any_cluster, job, held_end)
    got = wordcount.read_results(str(tmp_path))
    assert got == wordcount.reference(params)
    assert sum(got.values()) == 60_000 * 8
    assert job.summary()["sink_records"] == 60_000 * 8


def start_held_job(
    cluster: BackgroundCluster, tmp_path: Path, records: int, held_end: Path, hold_tasks: int = 2
) -> tuple:
    """The held job, stalled (its hold file exists) until the test removes the file, its
    end held back by ``held_end`` (the rest unpaced once released), once its sources read
    records.

    Not :func:`submit_running`'s wait for records at the sinks: the first batches (512
    records, 5 ms each in the held tasks) take about 10 s to get there; the sources read
    as soon as the job runs, and the held tasks are busy from their first batch on."""
    hold = tmp_path / "hold"
    hold.touch()
    out = tmp_path / "out"
    params = {
        "records": records,
        "rate": 10_000,
        "hold": str(hold),
        "output": str(out),
        "hold_tasks": hold_tasks,
    }
    graph = held_until_released(load_job("tests.e2e_jobs:held_job", params), held_end, hurry=True)
    job = cluster.submit(graph)
    wait_until(
        lambda: job.done or job.summary()["source_records"] >= 1,
        FLOWING_TIMEOUT_S,
        f"records at the sources of {job.id}",
    )
    assert not job.done, (job.status, job.error)
    return job, hold, out


@contextlib.contextmanager
def stage_window(cluster: BackgroundCluster, stages: int):
    """Run staged fluid changes with up to ``stages`` stages under way at once."""
    co = cluster.coordinator
    before = co.config
    co.config = replace(before, stage_window=stages)
    try:
        yield
    finally:
        co.config = before


def half_of_count_0(job, operator: str = "count") -> tuple:
    """A plan moving half of task 0's key groups to task 1 (of ``operator``: count by
    default), and those groups."""
    from controlplane.abstraction import AssignWorkload, Plan

    a = job.abstraction
    first, second = (f"{operator}-0", f"{operator}-1")
    groups = {t.id: list(t.workload.key_groups) for t in a.operator(operator).tasks}
    half = groups[first][: len(groups[first]) // 2]
    moved = {
        first: [g for g in groups[first] if g not in half],
        second: groups[second] + half,
    }
    return Plan(a.version, (AssignWorkload(operator, moved),)), half


def release_and_check(
    cluster: BackgroundCluster, job, hold: Path, out: Path, records: int, held_end: Path
) -> None:
    """Let the held job flow again and end; it finishes with every key counted exactly."""
    hold.unlink(missing_ok=True)
    finish(cluster, job, held_end)
    assert final_counts(out) == counting_reference(records)


def test_sync_that_cannot_complete_aborts_and_the_job_goes_on(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    records = 20_000
    job, hold, out = start_held_job(cluster, tmp_path, records, held_end)
    before = job.layout
    rec = cluster.call(
        cluster.coordinator.reconfigure(
            job.id, move_groups(before, list(range(16)), "count-0", "count-1"), sync_timeout_s=1.0
        )
    )
    assert rec.status == "aborted"
    assert "sync timed out after 1s" in rec.error and "count-" in rec.error
    assert job.status == "running"
    assert job.layout == before
    release_and_check(cluster, job, hold, out, records, held_end)


@pytest.mark.parametrize("window", [1, 2])
def test_a_fluid_plan_cut_short_keeps_its_completed_steps_and_exact_results(
    cluster: BackgroundCluster, tmp_path: Path, window: int, held_end: Path
) -> None:
    """A fluid rebalance in steps of one key group, held busy mid-plan (the one task that
    routes to the count tasks turns slow), ends ``failed`` at the first stage whose
    barrier could not start within the sync timeout, saying which steps stay applied;
    the job runs on that valid version and its results are exact. With two stages under
    way at once, both are withdrawn, the later first."""

    from controlplane.abstraction import diff

    records = 40_000
    job, hold, out = start_held_job(cluster, tmp_path, records, held_end, hold_tasks=1)
    hold.unlink()  # not held at first: the first steps complete
    a = job.abstraction
    plan, half = half_of_count_0(job)
    plan = replace(plan, mode="fluid", batch_size=1)

    async def run_and_hold():
        run = asyncio.ensure_future(
            cluster.coordinator.apply_plan(job.id, plan, sync_timeout_s=1.0)
        )
        while not job.reconfigurations or job.reconfigurations[-1].steps < 2:
            assert not run.done(), run.result().error
            await asyncio.sleep(0.001)  # a poll of the condition above, bounded by the call
        hold.touch()  # from now on a stage's barrier cannot start in time
        return await run

    with stage_window(cluster, window):
        rec = cluster.call(run_and_hold())
    assert rec.status == "failed", rec.error
    assert rec.runs == 1, rec.runs  # the steps ran as stages of one reconfiguration
    k = job.abstraction.version - a.version
    assert 2 <= k < len(half), (k, rec.error)
    assert (
        f"step {k + 1} of {len(half)} aborted: sync timed out after 1s: the barrier of stage"
        in rec.error
    )
    assert (
        f"steps 1 to {k} stay applied: the job runs on version {job.abstraction.version}"
        in rec.error
    )
    assert rec.steps == k
    assert job.status == "running"
    assert len(diff(a, job.abstraction).operator("count").key_group_moves) == k
    release_and_check(cluster, job, hold, out, records, held_end)


@pytest.mark.parametrize("window", [1, 2])
def test_fluid_steps_run_as_stages_without_pausing(
    cluster: BackgroundCluster, tmp_path: Path, window: int, held_end: Path
) -> None:
    """A fluid plan in batches runs as few live reconfigurations as it can: the batches
    that only move key groups among the same tasks are stages of one, each started by a
    barrier from the task that routes to the count tasks, and only that task pauses, once
    (stage 0). Per-key order and results hold, also with two stages under way at once."""
    from dataclasses import replace

    from controlplane.abstraction import AssignWorkload, Plan, migrate, scale

    with stage_window(cluster, window):
        records = 60_000
        out = tmp_path / "out"
        params = {"records": records, "rate": 20_000, "output": str(out), "pad": 400_000}
        job = submit_running(cluster, "tests.e2e_jobs:ordered_job", params, held_end)
        a = job.abstraction
        tasks = a.operator("count").tasks
        give = tasks[0].workload.key_groups[:24]
        moved = {
            tasks[0].id: [g for g in tasks[0].workload.key_groups if g not in give],
            tasks[1].id: [*tasks[1].workload.key_groups, *give],
        }
        plan = Plan(a.version, (AssignWorkload("count", moved),), mode="fluid", batch_size=4)
        rec = cluster.call(cluster.coordinator.apply_plan(job.id, plan))
        assert rec.status == "completed", rec.error
        assert (rec.steps, rec.runs) == (6, 1)
        assert [v.version for v in job.versions] == list(range(1, 8))
        assert all(rec.pause_ms[t] == 0.0 for t in rec.pause_ms if t.startswith("count-"))
        assert rec.pause_ms["number-0"] > 0.0, rec.pause_ms
        # A scale-out: the new task is made in stage 0, its key groups come in stages.
        rec = cluster.call(
            cluster.coordinator.apply_plan(
                job.id, replace(scale(job.abstraction, "count", 3), mode="fluid", batch_size=8)
            )
        )
        assert rec.status == "completed", rec.error
        assert rec.runs == 1 and rec.steps > 2, (rec.runs, rec.steps)
        # A migration through a stand-in: setup and batches in one run; the emptied task's move,
        # its taking its key groups back and the stand-in's removal in a second.
        a = job.abstraction
        worker = a.task("count-0").resources.worker
        other = next(w.id for w in a.workers if w.id != worker)
        rec = cluster.call(
            cluster.coordinator.apply_plan(
                job.id, replace(migrate(a, "count-0", other), mode="fluid", batch_size=8)
            )
        )
        assert rec.status == "completed", rec.error
        assert rec.runs == 2 and rec.steps > 4, (rec.runs, rec.steps)
        assert job.abstraction.task("count-0").resources.worker == other
        finish(cluster, job, held_end)
        assert final_counts(out) == counting_reference(records)


def test_a_worker_with_a_part_in_a_later_stage_only_reports_it(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """Stages under way at once are reported in order by each worker, of those it was
    told about: here count-2's worker has no part in stage 1 (count-0 gives groups to
    count-1 beside it) and a part in stage 2, which starts while stage 1 is under way
    (count-0 gives count-2 one group), and must report it without waiting for stage 1.
    The plan completes, the results are exact."""
    from controlplane.abstraction import AssignResource, AssignWorkload, Plan

    params = {"records": 120_000, "rate": 20_000, "output": str(tmp_path), "parallelism": 3}
    job = submit_running(cluster, "examples.wordcount:build", params, held_end)
    co = cluster.coordinator
    lone, rest = sorted(co.workers)[:2]
    a = job.abstraction
    there = {"count-2", "sink-2"}
    place = tuple(
        AssignResource(op.name, t.id, lone if t.id in there else rest)
        for op in a.operators
        for t in op.tasks
        if t.worker != (lone if t.id in there else rest)
    )
    rec = cluster.call(co.apply_plan(job.id, Plan(a.version, place)))
    assert rec.status == "completed", rec.error
    a = job.abstraction
    owned = {t.id: list(t.workload.key_groups) for t in a.operator("count").tasks}
    to_1, to_2 = owned["count-0"][:8], owned["count-0"][8]
    workload = {
        "count-0": owned["count-0"][9:],
        "count-1": owned["count-1"] + to_1,
        "count-2": [*owned["count-2"], to_2],
    }
    plan = Plan(a.version, (AssignWorkload("count", workload),), mode="fluid", batch_size=4)
    with stage_window(cluster, 2):
        rec = cluster.call(co.apply_plan(job.id, plan))
    assert rec.status == "completed", rec.error
    assert (rec.steps, rec.runs) == (3, 1)  # 4 and 4 groups to count-1, then 1 to count-2
    assert to_2 in job.abstraction.task("count-2").workload.key_groups
    finish(cluster, job, held_end)
    assert wordcount.read_results(str(tmp_path)) == wordcount.reference(params)


def test_fluid_moves_key_groups_without_pausing_their_owners(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """In fluid mode the count tasks that give and gain key groups never pause (only their
    upstream task, whose routing swaps, does), and records of a moving key group that
    arrive before its state wait for it and keep their order: the count fails the job on
    a record numbered lower than one it has counted for the key. A task migrated in one
    fluid step starts on its new worker at once, its records waiting the same way.
    Results are exact."""
    from dataclasses import replace

    from controlplane.abstraction import AssignWorkload, Plan, migrate, scale

    records = 60_000
    out = tmp_path / "out"
    # 400 kB per key: a key group takes milliseconds to ship, and records of it wait.
    params = {"records": records, "rate": 20_000, "output": str(out), "pad": 400_000}
    job = submit_running(cluster, "tests.e2e_jobs:ordered_job", params, held_end)
    for i in range(5):
        a = job.abstraction
        if i == 4:  # count-0 moves whole, in one step: its new instance starts at once
            worker = a.task("count-0").resources.worker
            other = next(w.id for w in a.workers if w.id != worker)
            rec = cluster.call(
                cluster.coordinator.apply_plan(
                    job.id, replace(migrate(a, "count-0", other), mode="fluid")
                )
            )
            assert rec.status == "completed", rec.error
            assert rec.steps == 1 and job.abstraction.task("count-0").resources.worker == other
            # Its sink kept its channel: it only had to align the barrier, never paused.
            assert "out-0" in rec.affected and rec.pause_ms["out-0"] == 0.0, rec.pause_ms
            continue
        if i == 2:  # a new count task (and sink) takes groups from count-0 and count-1
            plan = replace(scale(a, "count", 3), mode="fluid")
        else:  # the first task gives half its groups to the last
            tasks = a.operator("count").tasks
            give = tasks[0].workload.key_groups[: len(tasks[0].workload.key_groups) // 2]
            moved = {
                tasks[0].id: [g for g in tasks[0].workload.key_groups if g not in give],
                tasks[-1].id: [*tasks[-1].workload.key_groups, *give],
            }
            plan = Plan(a.version, (AssignWorkload("count", moved),), mode="fluid")
        rec = cluster.call(cluster.coordinator.apply_plan(job.id, plan))
        assert rec.status == "completed", rec.error
        owners = {t for t in rec.pause_ms if t.startswith("count-")}
        assert owners and all(rec.pause_ms[t] == 0.0 for t in owners), rec.pause_ms
        assert rec.pause_ms["number-0"] > 0.0, rec.pause_ms  # its routing swapped
        time.sleep(0.3)  # records flow between two changes (spacing, not a wait for anything)
    finish(cluster, job, held_end)
    assert final_counts(out) == counting_reference(records)


def test_a_second_reconfiguration_waits_or_is_refused(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    records = 20_000
    job, hold, out = start_held_job(cluster, tmp_path, records, held_end)
    co = cluster.coordinator
    first = move_groups(job.layout, list(range(16)), "count-0", "count-1")
    second = move_groups(job.layout, list(range(64, 80)), "count-1", "count-0")

    async def race() -> tuple:
        a = asyncio.create_task(co.reconfigure(job.id, first, sync_timeout_s=20))
        # The first is stuck in its sync: its barrier waits behind the held tasks.
        await until(
            lambda: job.reconfigurations and job.reconfigurations[-1].status == "syncing",
            "the first reconfiguration to sync",
        )
        try:
            await co.reconfigure(job.id, second, wait=False)
            refused = None
        except ReconfigurationBusy as exc:
            refused = str(exc)
        b = asyncio.create_task(co.reconfigure(job.id, second, sync_timeout_s=10))
        assert not a.done()
        # b's first step runs on the loop's next turn, long before the first's barrier
        # (which needs the workers' messages) lets it end: b waits its turn.
        hold.unlink()
        return refused, await a, await b

    refused, ra, rb = cluster.call(race())
    assert refused is not None and "being reconfigured" in refused
    assert ra.status == "completed", ra.error
    assert rb.status == "completed", rb.error
    # The waiting one started only once the first had ended: they never interleave.
    assert ra.ended_at is not None and rb.created_at >= ra.ended_at
    finish(cluster, job, held_end)
    assert final_counts(out) == counting_reference(records)


def test_stop_and_restart_baseline_is_exact(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    params = {"records": 40_000, "rate": 20_000, "output": str(tmp_path)}
    job = submit_running(cluster, "examples.wordcount:build", params, held_end)
    lay = job.layout
    a, p, w = dict(lay.assignment), dict(lay.placement), dict(lay.weights)
    a["count-0"], a["count-1"], a["count-2"] = (
        tuple(range(40)),
        tuple(range(40, 90)),
        tuple(range(90, 128)),
    )
    p["count-2"] = p["sink-2"] = "w2"
    w["sink-2"] = 1.0
    rec = cluster.call(
        cluster.coordinator.restart_with(job.id, lay.replace(assignment=a, placement=p, weights=w))
    )
    assert rec.status == "completed", rec.error
    assert set(rec.timings_ms) == {"snapshot", "redeploy", "total"}
    assert job.layout.tasks_of("count") == ["count-0", "count-1", "count-2"]
    finish(cluster, job, held_end)
    got = wordcount.read_results(str(tmp_path))
    assert got == wordcount.reference(params)
    assert job.summary()["source_records"] == 40_000
    assert job.summary()["sink_records"] == 40_000 * 8


def random_plan(rng, a):
    from controlplane.abstraction import Plan, migrate, rebalance, scale, update_logic

    workers = [w.id for w in a.workers if w.status == "alive"]
    count = a.operator("count")
    kind = rng.choice(["rebalance", "scale", "migrate", "logic", "combined"])
    if kind == "rebalance":
        loads = {g: rng.random() for t in count.tasks for g in t.workload.key_groups}
        return kind, rebalance(a, "count", loads)
    if kind == "scale":
        return kind, scale(
            a, "count", rng.choice([n for n in (1, 2, 3, 4) if n != len(count.tasks)])
        )
    if kind == "migrate":
        task = rng.choice(count.tasks)
        others = [w for w in workers if w != task.resources.worker]
        return kind, migrate(a, task.id, rng.choice(others))
    if kind == "logic":
        ref = rng.choice(["examples.wordcount:count_word_v2", "examples.wordcount:count_word"])
        if all(t.logic.ref == ref for t in count.tasks):
            ref = (
                "examples.wordcount:count_word_v2"
                if ref.endswith(":count_word")
                else "examples.wordcount:count_word"
            )
        some = None
        if len(count.tasks) > 1 and rng.random() < 0.5:  # some of the tasks, not all
            some = [t.id for t in rng.sample(list(count.tasks), len(count.tasks) - 1)]
        return kind, update_logic(a, "count", ref, some)
    # Combined: a rebalance and a migration of a split task in one plan.
    loads = {g: rng.random() for t in count.tasks for g in t.workload.key_groups}
    first = rebalance(a, "count", loads)
    split = rng.choice(a.operator("split").tasks)
    others = [w for w in workers if w != split.resources.worker]
    second = migrate(a, split.id, rng.choice(others))
    return kind, Plan(a.version, tuple(first.ops) + tuple(second.ops))


def busiest_since(job, since: int) -> int:
    """The most key groups one task gave, or gained, from version ``since`` to the job's
    current one (a fluid step moves at most ``batch_size`` out of and into each task)."""
    from test_abstraction_fluid import busiest

    return busiest(next(v for v in job.versions if v.version == since), job.abstraction)


def paced_randomly(rng, kind: str, plan):
    """Half of the plans that move key groups or keyed tasks run in fluid mode, in batches of
    4, 16 or all (a keyed task then moves through a stand-in)."""
    from dataclasses import replace

    if kind in ("rebalance", "scale", "migrate", "combined") and rng.random() < 0.5:
        return f"{kind} (fluid)", replace(plan, mode="fluid", batch_size=rng.choice([4, 16, None]))
    return kind, plan


def fire_random_plans(cluster: BackgroundCluster, job, make_plan, count: int = 6) -> list[str]:
    """Apply up to ``count`` plans from ``make_plan(abstraction) -> (kind, plan)`` while the
    job runs (its end held back: see :func:`submit_running`), each required to complete;
    returns the kinds applied."""
    done: list[str] = []
    for _ in range(count):
        kind, plan = make_plan(job.abstraction)
        if not plan.ops:
            continue
        rec = cluster.call(cluster.coordinator.apply_plan(job.id, plan))
        assert rec.status == "completed", f"{kind}: {rec.error}"
        assert rec.version == job.abstraction.version
        if plan.mode == "fluid" and plan.batch_size:
            moved = busiest_since(job, plan.base_version)
            assert rec.steps >= moved / plan.batch_size, (kind, rec.steps, moved)
        done.append(kind)
        time.sleep(0.2)  # records flow between two changes (spacing, not a wait for anything)
    return done


@pytest.mark.parametrize(
    ("seed", "backend"), [(1, "local"), (2, "local"), (3, "spark")], ids=["1", "2", "3-spark"]
)
def test_random_plans_while_records_flow_keep_results_exact(
    request: pytest.FixtureRequest, tmp_path: Path, seed: int, backend: str, held_end: Path
) -> None:
    import random

    cluster = request.getfixturevalue("cluster" if backend == "local" else "spark_cluster_idle")

    rng = random.Random(seed)
    params = {"records": 120_000, "rate": 20_000, "output": str(tmp_path)}
    job = submit_running(cluster, "examples.wordcount:build", params, held_end)
    done = fire_random_plans(cluster, job, lambda a: paced_randomly(rng, *random_plan(rng, a)))
    assert len(done) >= 4, done
    finish(cluster, job, held_end)
    got = wordcount.read_results(str(tmp_path))
    assert got == wordcount.reference(params)
    assert sum(got.values()) == 120_000 * 8
    versions = [v.version for v in job.versions]  # a fluid plan makes one per step
    assert versions == list(range(1, len(versions) + 1))
    assert len(versions) >= len(done) + 1


def test_stateless_operator_rebalances_by_weight_and_scales(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    from controlplane.abstraction import rebalance, scale

    records = 40_000
    params = {"records": records, "rate": 20_000, "output": str(tmp_path)}
    job = submit_running(cluster, "tests.e2e_jobs:enriched_job", params, held_end)
    co = cluster.coordinator
    rec = cluster.call(
        co.apply_plan(
            job.id, rebalance(job.abstraction, "enrich", {"enrich-0": 3.0, "enrich-1": 1.0})
        )
    )
    assert rec.status == "completed", rec.error
    weights = {t.id: t.workload.weight for t in job.abstraction.operator("enrich").tasks}
    assert weights["enrich-0"] < weights["enrich-1"]
    assert "keys-0" in rec.affected  # its routing weights changed
    rec = cluster.call(co.apply_plan(job.id, scale(job.abstraction, "enrich", 3)))
    assert rec.status == "completed", rec.error
    assert [t.id for t in job.abstraction.operator("enrich").tasks] == [
        "enrich-0",
        "enrich-1",
        "enrich-2",
    ]
    finish(cluster, job, held_end)
    assert final_counts(tmp_path) == counting_reference(records)


def test_migrate_to_a_new_worker_started_for_it(
    tmp_path: Path, no_leftover_processes: None, held_end: Path
) -> None:
    from controlplane.abstraction import migrate
    from controlplane.runner import LocalCluster

    params = {"records": 40_000, "rate": 20_000, "output": str(tmp_path)}

    async def main() -> tuple:
        async with LocalCluster(2) as c:
            co = c.coordinator
            graph = held_until_released(load_job("examples.wordcount:build", params), held_end)
            job = await co.submit(graph)
            await flowing(job)
            rec = await co.apply_plan(job.id, migrate(job.abstraction, "count-1", "new"))
            held_end.unlink()
            status = await job.wait(60)
            return rec, status, job.abstraction, sorted(co.workers)

    rec, status, abstraction, workers = asyncio.run(main())
    assert rec.status == "completed", rec.error
    assert workers == ["w1", "w2", "w3"]
    assert abstraction.task("count-1").resources.worker == "w3"
    assert abstraction.worker("w3").status == "alive"
    assert status == "finished"
    assert wordcount.read_results(str(tmp_path)) == wordcount.reference(params)


def test_a_worker_lost_while_a_change_waits_on_it_fails_the_change_at_once(
    tmp_path: Path, no_leftover_processes: None, held_end: Path
) -> None:
    """A worker killed as a change starts to prepare: the change fails with the worker's
    death as its reason, not with the prepare timeout (15 s). The new worker
    of a migration: the job goes on unchanged and its results are exact. A worker of the
    job, in a fluid plan (whose steps have no record of their own): the job fails too, and
    the plan with it."""
    from controlplane.abstraction import Plan, migrate, scale
    from controlplane.coordinator import RunningJob, RunReport
    from controlplane.runner import LocalCluster

    params = {"records": 120_000, "rate": 20_000, "output": str(tmp_path)}

    async def change_killing(c: LocalCluster, job: RunningJob, plan: Plan, victim: str):
        """Apply ``plan``, killing worker ``victim`` as the change starts preparing;
        returns the record."""
        co = c.coordinator
        killed: list[int] = []

        def kill_at_prepare(rec: RunReport) -> None:
            if rec.status == "preparing" and not killed:
                assert c.backend is not None
                killed.append(co.workers[victim].pid)
                c.backend.kill_worker(killed[0])

        rec = await co.apply_plan(job.id, plan, on_change=kill_at_prepare)
        assert killed, "the change never started preparing"
        return rec

    async def new_worker_dies() -> tuple:
        async with LocalCluster(2) as c:
            graph = held_until_released(load_job("examples.wordcount:build", params), held_end)
            job = await c.coordinator.submit(graph)
            await flowing(job)
            plan = migrate(job.abstraction, "count-1", "new")
            rec = await change_killing(c, job, plan, "w3")
            version = job.abstraction.version
            held_end.unlink()
            return rec, version, await job.wait(60)

    rec, version, status = asyncio.run(new_worker_dies())
    # Its death is the reason, not the prepare timeout (which would say "timed out").
    assert rec.status == "failed" and "timed out" not in rec.error, (rec.status, rec.error)
    assert "worker w3" in rec.error and "died" in rec.error, rec.error
    assert version == 1 and status == "finished"
    assert wordcount.read_results(str(tmp_path)) == wordcount.reference(params)

    async def job_worker_dies() -> tuple:
        async with LocalCluster(2) as c:
            unbounded = {"records": 0, "rate": 20_000}
            job = await c.coordinator.submit(load_job("examples.wordcount:build", unbounded))
            await flowing(job)
            plan = replace(scale(job.abstraction, "count", 3), mode="fluid", batch_size=1)
            rec = await change_killing(c, job, plan, "w2")
            return rec, await job.wait(10), job.error

    rec, status, error = asyncio.run(job_worker_dies())
    assert rec.status == "failed" and "timed out" not in rec.error, (rec.status, rec.error)
    assert "worker w2" in rec.error, rec.error  # its death, or a channel from it broken
    assert status == "failed" and "worker w2" in error


def test_a_worker_without_tasks_of_the_job_joins_it(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    from controlplane.abstraction import scale

    params = {"records": 40_000, "rate": 20_000, "parallelism": 1, "output": str(tmp_path)}
    job = submit_running(cluster, "examples.wordcount:build", params, held_end)
    assert job.layout.workers_used() == ["w1"]
    rec = cluster.call(cluster.coordinator.apply_plan(job.id, scale(job.abstraction, "count", 2)))
    assert rec.status == "completed", rec.error
    assert job.layout.placement["count-1"] == "w2"
    finish(cluster, job, held_end)
    assert wordcount.read_results(str(tmp_path)) == wordcount.reference(params)


def test_a_worker_whose_tasks_all_left_takes_tasks_again_after_other_changes(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """w2 hosts tasks of the job, then none while the job changes elsewhere, then some again:
    what it knew of the job's layout when its last task left is stale by then (it failed
    the prepare: "tasks ['count-0'] change but are not in the affected set")."""
    from controlplane.abstraction import migrate, rebalance

    params = {"records": 60_000, "rate": 20_000, "parallelism": 2, "output": str(tmp_path)}
    graph = held_until_released(load_job("examples.wordcount:build", params), held_end)
    job = cluster.call(cluster.coordinator.submit(graph, ["w1"]))
    assert job.layout.workers_used() == ["w1"]
    until_flowing(job)
    loads = {g: 10.0 if g < 20 else 1.0 for g in range(128)}
    for step in [
        lambda a: migrate(a, "count-1", "w2", with_forward=True),
        lambda a: migrate(a, "count-1", "w1", with_forward=True),
        lambda a: rebalance(a, "count", loads),  # on w1 only: w2 is not told
        lambda a: migrate(a, "count-1", "w2", with_forward=True),
    ]:
        rec = cluster.call(cluster.coordinator.apply_plan(job.id, step(job.abstraction)))
        assert rec.status == "completed", rec.error
        time.sleep(0.2)  # records flow between two changes (spacing, not a wait for anything)
    assert job.layout.placement["count-1"] == "w2"
    finish(cluster, job, held_end)
    assert wordcount.read_results(str(tmp_path)) == wordcount.reference(params)


def links_to(pid: int, port: int) -> list:
    """The open TCP connections of process ``pid`` to ``port`` on loopback."""
    return [
        c
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    ]


async def until_no_links(pid: int, port: int, what: str) -> None:
    """Wait (30 s at most) until process ``pid`` holds no connection to ``port``."""
    await until(lambda: not links_to(pid, port), f"{what} to close", timeout=30.0)


def test_a_worker_its_tasks_left_lets_go_of_the_job_and_can_take_tasks_again(
    tmp_path: Path, no_leftover_processes: None, held_end: Path
) -> None:
    """count-1 goes to w2 and back, twice, while the job runs. Each time it is back, w2
    hosts none of the job's tasks: w2 closes its connections to w1 (the state it sent back
    went on one) and w1 closes its own to w2 (it fed count-1 there), without waiting for
    the job to stop. w2, having forgotten the job, takes count-1 again as a worker joining
    it, and the job ends exact."""
    from controlplane.abstraction import migrate
    from controlplane.runner import LocalCluster

    params = {"records": 150_000, "rate": 15_000, "parallelism": 2, "output": str(tmp_path)}

    async def scenario() -> None:
        async with LocalCluster(2) as c:
            co = c.coordinator
            w1, w2 = co.alive_workers()
            graph = held_until_released(load_job("examples.wordcount:build", params), held_end)
            job = await co.submit(graph, [w1.id])
            await flowing(job)
            for _ in range(2):
                for target in (w2.id, w1.id):
                    plan = migrate(job.abstraction, "count-1", target, with_forward=True)
                    rec = await co.apply_plan(job.id, plan)
                    assert rec.status == "completed", rec.error
                    if target == w2.id:
                        assert links_to(w1.pid, w2.data_port), "w1 feeds count-1 on w2"
                assert not job.done, (job.status, job.error)
                await until_no_links(w2.pid, w1.data_port, "w2's connections to w1")
                await until_no_links(w1.pid, w2.data_port, "w1's connections to w2")
            held_end.unlink()
            assert await job.wait(60) == "finished", job.error

    asyncio.run(scenario())
    assert wordcount.read_results(str(tmp_path)) == wordcount.reference(params)


@pytest.mark.parametrize("end", ["retired", "killed"])
def test_a_drained_worker_can_go_while_the_job_runs_on(
    end: str, tmp_path: Path, no_leftover_processes: None, held_end: Path
) -> None:
    """Every task on w2 moves to w3 (draining a machine), then w2 goes: retired, or killed
    outright. The job never uses w2 again and ends exact. Before, w1 still took w2's
    connection for the one feeding count-0 from split-1 (which had moved to w3): "worker w2
    disconnected before the end of job-1/split-1>count-0" failed the job."""
    from controlplane.abstraction import Plan, migrate
    from controlplane.runner import LocalCluster

    params = {"records": 80_000, "rate": 16_000, "parallelism": 2, "output": str(tmp_path)}

    async def scenario() -> None:
        async with LocalCluster(3) as c:
            co = c.coordinator
            w1, w2, w3 = co.alive_workers()
            graph = held_until_released(load_job("examples.wordcount:build", params), held_end)
            job = await co.submit(graph, [w1.id, w2.id])
            await flowing(job)
            a = job.abstraction
            on_w2 = [t.id for op in a.operators for t in op.tasks if t.resources.worker == w2.id]
            assert len(on_w2) == 4, on_w2  # a source, split, count and sink
            ops = [op for tid in on_w2 for op in migrate(a, tid, w3.id).ops]
            rec = await co.apply_plan(job.id, Plan(a.version, tuple(ops)))
            assert rec.status == "completed", rec.error
            assert w2.id not in job.layout.workers_used()
            if end == "retired":
                await co.retire_worker(w2.id, "drained for maintenance")
            else:
                psutil.Process(w2.pid).kill()
            await until(
                lambda: co.workers[w2.id].status != "alive", f"the coordinator to see {end} w2"
            )
            assert not job.done, (job.status, job.error)
            held_end.unlink()
            assert await job.wait(60) == "finished", job.error
            assert co.workers[w2.id].status == ("stopped" if end == "retired" else "lost")

    asyncio.run(scenario())
    assert wordcount.read_results(str(tmp_path)) == wordcount.reference(params)


def test_workers_a_job_does_not_use_load_its_code_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leftover_processes: None
) -> None:
    """A worker that hosts none of a job's tasks imports the job's code when the job starts,
    and so does a worker that registers later: a task moved to one of them does not wait
    for the imports in the prepare (about 25 ms for the word count on a fresh worker here,
    against 0.3 ms for the rest of joining the job)."""
    from controlplane.abstraction import migrate
    from controlplane.coordinator.workers import start_workers
    from controlplane.runner import LocalCluster

    notes = tmp_path / "imports"
    monkeypatch.setenv("STREAMPILOT_TEST_IMPORTS", str(notes))  # workers inherit it

    def imported_by() -> set[int]:
        return {int(line) for line in notes.read_text().split()} if notes.exists() else set()

    async def until_imported_by(pid: int) -> None:
        await until(lambda: pid in imported_by(), f"worker pid {pid} to import the job's code")

    async def scenario() -> None:
        async with LocalCluster(2) as c:
            co = c.coordinator
            w1, w2 = co.alive_workers()
            job = await co.submit(load_job("tests.import_noting_job:build", {}), [w1.id])
            assert job.status == "running", job.error
            await until_imported_by(w2.pid)
            (w3,) = await start_workers(co, 1, "a spare")
            await until_imported_by(w3.pid)
            for target in (w2.id, w3.id):
                rec = await co.apply_plan(job.id, migrate(job.abstraction, "count-1", target))
                assert rec.status == "completed", rec.error
            assert w1.pid in imported_by()
            await co.stop_job(job.id)

    asyncio.run(scenario())


def submit_stock_exchange(cluster: BackgroundCluster, out: Path, held_end: Path) -> tuple:
    """The bounded stock exchange (80,000 orders at 16,000/s, match and stats on 2 tasks)
    writing to ``out``, running until ``held_end`` goes (see :func:`submit_running`):
    (job, params)."""
    params = {"records": 80_000, "rate": 16_000, "sources": 1, "parallelism": 2}
    params["output"] = str(out)
    return submit_running(cluster, "examples.stock_exchange:build", params, held_end), params


def assert_stock_exchange_exact(out: Path, params: dict) -> None:
    """Its trades, statistics and alerts are those of the reference run."""
    from examples import stock_exchange

    got, want = stock_exchange.read_results(out), stock_exchange.reference(params)
    assert got["trades"] == want["trades"]
    assert got["stats"] == want["stats"]
    assert got["alerts"] == want["alerts"]
    assert len(got["trades"]) > 1000


def random_stock_plan(rng, a):
    from controlplane.abstraction import Plan, migrate, rebalance, scale

    workers = [w.id for w in a.workers if w.status == "alive"]
    op = rng.choice(["match", "stats"])
    tasks = a.operator(op).tasks
    kind = rng.choice(["rebalance", "scale", "migrate", "both operators"])
    if kind == "rebalance":
        return kind, rebalance(
            a, op, {g: rng.random() for t in tasks for g in t.workload.key_groups}
        )
    if kind == "scale":
        return kind, scale(a, op, rng.choice([n for n in (1, 2, 3) if n != len(tasks)]))
    if kind == "migrate":
        task = rng.choice(tasks)
        return kind, migrate(
            a, task.id, rng.choice([w for w in workers if w != task.resources.worker])
        )
    plans = [
        rebalance(
            a,
            name,
            {g: rng.random() for t in a.operator(name).tasks for g in t.workload.key_groups},
        )
        for name in ("match", "stats")
    ]
    return kind, Plan(a.version, tuple(plans[0].ops) + tuple(plans[1].ops))


def stock_exchange_under_random_plans(
    cluster: BackgroundCluster, out: Path, seed: int, held_end: Path
):
    """The bounded stock exchange under random plans (at least 4) fired while orders
    flow: it finishes with exact trades, statistics and alerts. Returns the job."""
    import random

    rng = random.Random(seed)
    job, params = submit_stock_exchange(cluster, out, held_end)
    kinds = fire_random_plans(cluster, job, lambda a: random_stock_plan(rng, a))
    assert len(kinds) >= 4, kinds
    finish(cluster, job, held_end)
    assert_stock_exchange_exact(out, params)
    return job


def test_stock_exchange_under_random_plans_keeps_trades_and_stats_exact(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    stock_exchange_under_random_plans(cluster, tmp_path, seed=7, held_end=held_end)


def test_logic_swap_of_some_tasks_only(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    from controlplane.abstraction import update_logic
    from runtime.keygroups import key_group

    records = 40_000
    params = {"records": records, "rate": 20_000, "output": str(tmp_path)}
    job = submit_running(cluster, "tests.e2e_jobs:counting_job", params, held_end)
    plan = update_logic(job.abstraction, "count", "tests.e2e_jobs:count_tagged", ["count-1"])
    rec = cluster.call(cluster.coordinator.apply_plan(job.id, plan))
    assert rec.status == "completed", rec.error
    assert rec.affected == {"count-1"}  # nothing else pauses for a logic swap
    a = job.abstraction
    assert a.task("count-0").logic.ref == "tests.e2e_jobs:count"
    assert (a.task("count-1").logic.ref, a.task("count-1").logic.version) == (
        "tests.e2e_jobs:count_tagged",
        2,
    )
    finish(cluster, job, held_end)
    parts = read_parts(tmp_path)
    tagged = {r[0] for r in parts if len(r) == 3}
    owned_by_1 = set(a.task("count-1").workload.key_groups)
    assert tagged and all(key_group(k, 128) in owned_by_1 for k in tagged)
    assert not any(len(r) == 3 and key_group(r[0], 128) not in owned_by_1 for r in parts)
    assert final_counts(tmp_path) == counting_reference(records)


def test_a_listener_follows_the_record_through_every_phase(cluster: BackgroundCluster) -> None:
    from controlplane.abstraction import rebalance

    job = cluster.submit(
        load_job(
            "tests.e2e_jobs:counting_job",
            {"rate": 5_000},
        ),
        job_id="followed-1",
    )
    seen: list[tuple[str, bool]] = []
    try:
        until_flowing(job)
        assert job.id == "followed-1" and job.abstraction.job_id == "followed-1"
        plan = rebalance(job.abstraction, "count", {g: float(g) for g in range(128)})
        rec = cluster.call(
            cluster.coordinator.apply_plan(
                job.id, plan, on_change=lambda r: seen.append((r.status, r.ended_at is not None))
            )
        )
    finally:
        cluster.call(cluster.coordinator.stop_job(job.id))
    assert rec.status == "completed", rec.error
    assert [s for s, _ in seen][:5] == ["pending", "preparing", "syncing", "updating", "completed"]
    assert seen[-1] == ("completed", True)


def test_restart_baseline_on_new_workers(
    no_leftover_processes: None, tmp_path: Path, held_end: Path
) -> None:
    """The baseline on new worker processes: the old ones exit, the results stay exact, and
    it is refused (nothing changed) while another job shares the workers."""
    from controlplane.abstraction import scale

    c = BackgroundCluster(workers=2)
    try:
        co = c.coordinator
        params = {"records": 40_000, "rate": 20_000, "output": str(tmp_path / "out")}
        job = submit_running(c, "examples.wordcount:build", params, held_end)
        other = c.submit(load_job("examples.wordcount:build", {"records": 0, "rate": 100}))
        until_flowing(other)
        with pytest.raises(ReconfigurationError, match=r"worker w1 also runs job .*same workers"):
            c.call(
                co.apply_plan(
                    job.id, scale(job.abstraction, "count", 3), restart=True, new_workers=True
                )
            )
        assert job.status == "running" and job.abstraction.version == 1
        c.call(co.stop_job(other.id))
        rec = c.call(
            co.apply_plan(
                job.id, scale(job.abstraction, "count", 3), restart=True, new_workers=True
            )
        )
        assert rec.status == "completed", rec.error
        assert rec.worker_map == {"w1": "w3", "w2": "w4"}
        assert set(job.layout.workers_used()) == {"w3", "w4"}
        placed = {t.resources.worker for op in job.abstraction.operators for t in op.tasks}
        assert placed == {"w3", "w4"}
        assert job.layout.tasks_of("count") == ["count-0", "count-1", "count-2"]
        # The old workers are gone once it returns, and the new version says so: a helper
        # run on it places tasks on the new workers only.
        assert {co.workers["w1"].status, co.workers["w2"].status} == {"lost"}
        status = {w.id: w.status for w in job.abstraction.workers}
        assert status == {"w1": "lost", "w2": "lost", "w3": "alive", "w4": "alive"}
        rec = c.call(co.apply_plan(job.id, scale(job.abstraction, "count", 4)))
        assert rec.status == "completed", rec.error
        assert set(job.layout.workers_used()) == {"w3", "w4"}
        finish(c, job, held_end)
        assert wordcount.read_results(str(tmp_path / "out")) == wordcount.reference(params)
        assert job.summary()["sink_records"] == 40_000 * 8
    finally:
        c.close()
