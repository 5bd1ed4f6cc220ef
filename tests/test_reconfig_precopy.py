"""Pre-copy on real worker processes (runtime.precopy): key groups that leave for another
worker are copied ahead while their task runs, the update ships what changed since, and
the results stay exact whatever the change, its mode, or a cancel during the copying."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from controlplane.abstraction import migrate
from controlplane.coordinator import RuntimeConfig
from controlplane.testing import BackgroundCluster
from examples import wordcount
from runtime.copyahead import PRECOPY_RATE_MIN_BYTES
from tests.test_reconfig_e2e import (
    finish,
    fire_random_plans,
    half_of_count_0,
    paced_randomly,
    random_plan,
    stock_exchange_under_random_plans,
    submit_running,
    until_flowing,
)

pytestmark = pytest.mark.slow

# 400 words of 60 kB each: about 12 MB of state per count task, under the 32 MB from which
# a task copies its leaving key groups ahead by default; the tests that copy use a cluster
# that copies whatever the size.
PADDED = {"keys": 400, "state_bytes": 60_000, "records": 60_000, "rate": 20_000}
# Words counted by then, every one of the 400 seen (the rarest has p = 1/2,630 under Zipf 1):
# the state is at its full size.
WORDS_SEEN = 160_000


@pytest.fixture(scope="module")
def copying_cluster() -> Iterator[BackgroundCluster]:
    """2 workers whose tasks copy every leaving key group ahead, however small."""
    c = BackgroundCluster(workers=2, config=RuntimeConfig(precopy_min_bytes=0))
    try:
        yield c
    finally:
        c.close()


def submit_padded(cluster: BackgroundCluster, out: Path, held_end: Path):
    """The padded word count, running until ``held_end`` goes, its state at full size."""
    params = {**PADDED, "output": str(out)}
    job = submit_running(cluster, "examples.wordcount:build", params, held_end)
    until_flowing(job, WORDS_SEEN)
    return job, params


def other_worker(job, task: str) -> str:
    here = job.layout.placement[task]
    return next(w.id for w in job.abstraction.workers if w.id != here)


def migrate_count_0(cluster: BackgroundCluster, job, target: str | None = None, **options):
    """Migrate count-0 to ``target`` (by default its other worker); the record."""
    plan = migrate(job.abstraction, "count-0", target or other_worker(job, "count-0"))
    return cluster.call(cluster.coordinator.apply_plan(job.id, plan, **options))


def assert_finishes_exact(
    cluster: BackgroundCluster, job, out: Path, params: dict, held_end: Path
) -> None:
    finish(cluster, job, held_end)
    assert wordcount.read_results(str(out)) == wordcount.reference(params)


def assert_copied_ahead(rec, at_least: int) -> None:
    assert rec.status == "completed", rec.error
    assert sum(c["bytes"] for c in rec.precopied.values()) >= at_least, rec.precopied
    assert rec.timings_ms["precopy"] <= rec.timings_ms["prepare"]


def test_a_migration_copies_its_state_ahead_and_the_counts_stay_exact(
    copying_cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    job, params = submit_padded(copying_cluster, tmp_path, held_end)
    rec = migrate_count_0(copying_cluster, job)
    assert_copied_ahead(rec, 4 << 20)
    # No pause budget (the default): everything is copied ahead, nothing left for the update.
    assert [c["left_bytes"] for c in rec.precopied.values()] == [0], rec.precopied
    assert_finishes_exact(copying_cluster, job, tmp_path, params, held_end)


def test_a_pause_budget_stops_the_copy_ahead_once_the_rest_fits_in_it(
    tmp_path: Path, held_end: Path
) -> None:
    """With a pause budget that all of count-0's 12 MB would ship within, the copy ahead
    stops as soon as it has measured its rate (after 4 MB): the rest goes whole in the
    update, and the counts stay exact."""
    config = RuntimeConfig(precopy_min_bytes=0, precopy_pause_ms=60_000)
    cluster = BackgroundCluster(workers=2, config=config)
    try:
        job, params = submit_padded(cluster, tmp_path, held_end)
        rec = migrate_count_0(cluster, job)
        assert_copied_ahead(rec, PRECOPY_RATE_MIN_BYTES)
        (copied,) = rec.precopied.values()
        assert copied["bytes"] < PRECOPY_RATE_MIN_BYTES + (1 << 20), copied  # a group more
        assert copied["left_bytes"] > 4 << 20, copied  # the update shipped the rest
        assert_finishes_exact(cluster, job, tmp_path, params, held_end)
    finally:
        cluster.close()


def test_state_under_the_threshold_is_not_copied_ahead(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """About 12 MB per task, under the default 32 MB: the migration ships it in its update."""
    job, params = submit_padded(cluster, tmp_path, held_end)
    rec = migrate_count_0(cluster, job)
    assert rec.status == "completed", rec.error
    assert rec.precopied == {} and "precopy" not in rec.timings_ms
    assert_finishes_exact(cluster, job, tmp_path, params, held_end)


def test_a_saturated_worker_copies_ahead_without_waiting_for_idle_moments_it_never_has(
    copying_cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """The job runs as fast as it can, so the tasks of both workers always have input
    waiting: the copy ahead waits for idle moments a second in all on each end
    (``handover.PRECOPY_IDLE_BUDGET_S``), then goes on without (before, each
    of count-0's 64 key groups waited 50 ms for them: 3.4 s), and the counts stay exact."""
    cluster = copying_cluster
    params = {**PADDED, "records": 1_000_000, "rate": 0, "output": str(tmp_path)}
    job = submit_running(cluster, "examples.wordcount:build", params, held_end)
    until_flowing(job, WORDS_SEEN)
    rec = migrate_count_0(cluster, job)
    assert_copied_ahead(rec, 4 << 20)
    (copied,) = rec.precopied.values()
    assert copied["groups"] >= 32, copied
    assert copied["waited_ms"] < 32 * 50, copied  # the 50 ms wait, for half the groups
    assert copied["room_ms"] < 32 * 50, copied  # the receiver's, as long
    assert_finishes_exact(cluster, job, tmp_path, params, held_end)


@pytest.mark.parametrize("mode", ["pause", "fluid"])
def test_a_rebalance_across_workers_copies_ahead_in_either_mode(
    copying_cluster: BackgroundCluster, tmp_path: Path, mode: str, held_end: Path
) -> None:
    """Half of count-0's key groups go to count-1, which runs on the other worker: the
    giver copies them ahead, then ships what changed (paused, or while it runs)."""
    cluster = copying_cluster
    job, params = submit_padded(cluster, tmp_path, held_end)
    co = cluster.coordinator
    if job.layout.placement["count-0"] == job.layout.placement["count-1"]:
        move = migrate(job.abstraction, "count-1", other_worker(job, "count-1"))
        assert cluster.call(co.apply_plan(job.id, move)).status == "completed"
    plan, _half = half_of_count_0(job)
    rec = cluster.call(co.apply_plan(job.id, replace(plan, mode=mode)))
    assert_copied_ahead(rec, 2 << 20)
    assert_finishes_exact(cluster, job, tmp_path, params, held_end)


def test_a_change_cancelled_while_it_copies_ahead_changes_nothing(
    copying_cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """Cancelled as it prepares (the copying ahead starts then): nothing changed, what
    was copied is dropped, and the same migration then goes through."""
    cluster = copying_cluster
    job, params = submit_padded(cluster, tmp_path, held_end)
    co = cluster.coordinator
    before = job.layout
    target = other_worker(job, "count-0")

    def cancel_when_preparing(rec) -> None:
        if rec.status == "preparing":
            co.cancel_plan(job.id, "not now")

    rec = migrate_count_0(cluster, job, target, on_change=cancel_when_preparing)
    assert (rec.status, rec.error) == ("cancelled", "not now")
    assert job.layout == before
    assert_copied_ahead(migrate_count_0(cluster, job, target), 4 << 20)
    assert_finishes_exact(cluster, job, tmp_path, params, held_end)


def test_random_plans_with_every_key_group_copied_ahead_keep_counts_exact(
    copying_cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """Every kind of plan (rebalance, scale, migrate, logic, combined; pause or fluid),
    each key group that leaves for another worker copied ahead first, while records flow."""
    rng = random.Random(4)
    params = {"records": 120_000, "rate": 20_000, "output": str(tmp_path)}
    job = submit_running(copying_cluster, "examples.wordcount:build", params, held_end)
    done = fire_random_plans(
        copying_cluster, job, lambda a: paced_randomly(rng, *random_plan(rng, a))
    )
    assert len(done) >= 4, done
    copied = [r for r in job.reconfigurations if r.precopied]
    assert len(copied) >= 2, [(r.id, r.status) for r in job.reconfigurations]
    assert_finishes_exact(copying_cluster, job, tmp_path, params, held_end)


def test_stock_exchange_with_every_key_group_copied_ahead_keeps_trades_exact(
    copying_cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    job = stock_exchange_under_random_plans(copying_cluster, tmp_path, seed=8, held_end=held_end)
    assert any(r.precopied for r in job.reconfigurations)
