"""Allowed lateness in event-time windows: a record within it updates its window, which
is emitted again at once (once: a window it opens closed has no timer for its close),
and ``window_aggregate``, split or not, gives the results ``window`` gives. Driven by
hand on the processor workers build, then end to end on real worker processes, with a
source whose late phases come in once every task's watermark has passed the previous one
(:mod:`tests.lateness_jobs`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from controlplane.abstraction import split_key
from controlplane.testing import BackgroundCluster
from runtime.dataflow import load_job
from runtime.eventtime import RESOLUTION_S
from runtime.state import TIMERS
from runtime.windows import (
    Count,
    LateRecord,
    Session,
    Sliding,
    Tumbling,
    WindowLogic,
    WindowResult,
)
from tests.api_support import wait_until
from tests.lateness_jobs import (
    HOT,
    difference,
    last_results,
    read_output,
    reference,
    watermarks,
)
from tests.test_event_time import Harness
from tests.test_windows_e2e import event_time_of

WAIT_S = 120.0  # a phase of these jobs is through every task within this on the busiest machine
JOB = "tests.lateness_jobs:lateness_job"


def results(h: Harness) -> list[WindowResult]:
    return [r for r, _ in h.take()]


def no_timers_left(h: Harness) -> bool:
    return all(TIMERS not in h.state.group(g) for g in h.state.owned())


def test_a_late_record_that_opens_a_closed_window_fires_it_once() -> None:
    """Within the lateness, no state for its window yet: the window fires at once, with
    no timer for its close (Flink's EventTimeTrigger.onElement), only for its cleanup."""
    h = Harness(WindowLogic(Tumbling(1.0), Count(), allowed_lateness_s=1.0))
    h.feed(("a", 1_000, 0))
    h.p.on_watermark(2.5)
    assert results(h) == [WindowResult("a", 1.0, 2.0, 1)]
    h.feed(("b", 1_500, 0))
    assert results(h) == [WindowResult("b", 1.0, 2.0, 1)]
    h.p.on_watermark(2.6)  # a timer at its close, past due, would fire it again now
    assert results(h) == []
    h.p.on_watermark(math.inf)
    assert results(h) == [] and no_timers_left(h)


def test_a_late_record_in_sliding_windows_fires_the_closed_ones_at_once_and_the_open_ones_at_close() -> (
    None
):
    """One record at 2.2 with the watermark at 3.5 - RESOLUTION_S: of its windows, [0.5,
    2.5) is past its lateness, [1, 3) and [1.5, 3.5) closed (fired at once, once), [2, 4)
    open (fired at its close)."""
    h = Harness(WindowLogic(Sliding(2.0, 0.5), Count(), allowed_lateness_s=1.0))
    h.p.on_watermark(3.5 - RESOLUTION_S)
    h.feed(("a", 2_200, 0))
    assert sorted(results(h)) == [WindowResult("a", 1.0, 3.0, 1), WindowResult("a", 1.5, 3.5, 1)]
    h.p.on_watermark(3.6)
    assert results(h) == []
    h.p.on_watermark(4.0)
    assert results(h) == [WindowResult("a", 2.0, 4.0, 1)]
    h.p.on_watermark(math.inf)
    assert results(h) == [] and no_timers_left(h)


def test_a_late_record_merged_into_a_fired_session_fires_it_once() -> None:
    h = Harness(WindowLogic(Session(1.0), Count(), allowed_lateness_s=2.0))
    h.feed(("a", 1_000, 0))
    h.p.on_watermark(2.5)
    assert results(h) == [WindowResult("a", 1.0, 2.0, 1)]
    h.feed(("a", 1_100, 0))  # [1.1, 2.1) merges into [1, 2.1), closed already
    assert results(h) == [WindowResult("a", 1.0, 2.1, 2)]
    h.p.on_watermark(2.6)
    assert results(h) == []
    h.p.on_watermark(math.inf)
    assert results(h) == [] and no_timers_left(h)


def test_a_record_past_its_own_session_joins_one_still_within_the_lateness() -> None:
    """Lateness is the merged session's (Flink merges first): a record at 1.5 whose own
    [1.5, 2.5) is past the lateness but falls in [0, 5), fired and kept a second longer,
    updates it; of a key with no session there it is late."""
    h = Harness(WindowLogic(Session(1.0), Count(), allowed_lateness_s=1.0, late="emit"))
    h.feed(*(("a", ms, 0) for ms in range(0, 4_500, 500)))
    h.p.on_watermark(5.5)
    assert results(h) == [WindowResult("a", 0.0, 5.0, 9)]
    h.feed(("a", 1_500, 0), ("b", 1_500, 0))
    assert results(h) == [WindowResult("a", 0.0, 5.0, 10), LateRecord("b", ("b", 1_500, 0), 1.5)]
    h.p.on_watermark(math.inf)
    assert results(h) == [] and no_timers_left(h)


def test_a_session_merged_away_leaves_the_timer_another_session_closes_on() -> None:
    """Timers are per key and time: [0, 2)'s cleanup (2 + 3 s of lateness) is [3, 5)'s
    close. [0, 2) merging into [0, 2.5) deletes its timers but that one: [3, 5) fires."""
    assert (2.0 - RESOLUTION_S) + 3.0 == 5.0 - RESOLUTION_S
    h = Harness(WindowLogic(Session(2.0), Count(), allowed_lateness_s=3.0))
    h.feed(("a", 0, 0), ("a", 3_000, 0))
    h.feed(("a", 500, 0))
    h.p.on_watermark(math.inf)
    assert sorted(results(h)) == [WindowResult("a", 0.0, 2.5, 2), WindowResult("a", 3.0, 5.0, 1)]
    assert no_timers_left(h)


# -- end to end ---------------------------------------------------------------------------


def run_in_phases(
    cluster: BackgroundCluster, params: dict[str, Any], between: Any = None
) -> tuple[list[tuple], list[tuple]]:
    """Run :func:`tests.lateness_jobs.lateness_job`, letting each phase in once every
    task's watermark has reached the end of the one before (``between(job)`` then, after
    the first); its results and late records."""
    gates = Path(params["gates"])
    gates.mkdir()
    job = cluster.submit(load_job(JOB, params))
    try:
        for phase, watermark in enumerate(watermarks()):
            if phase and between is not None:
                between(job)
            (gates / str(phase)).touch()
            if watermark == math.inf:
                break
            wait_until(
                lambda w=watermark: (
                    job.done or all(reached(job, t, w) for t in job.graph.task_ids())
                ),
                WAIT_S,
                f"every task's watermark at {watermark} (phase {phase} in)",
            )
            assert not job.done, job.error
    finally:
        for phase in range(len(watermarks())):
            (gates / str(phase)).touch()  # a failing test's job ends
    assert cluster.wait(job, WAIT_S) == "finished", job.error
    return read_output(params["output"])


def reached(job: Any, task: str, watermark: float) -> bool:
    report = event_time_of(job, task)
    return report is not None and (report["watermark"] or -math.inf) >= watermark


@pytest.mark.slow
@pytest.mark.parametrize("window,late", [("tumbling", "drop"), ("sliding", "emit")])
def test_window_and_window_aggregate_give_the_same_results_with_late_records(
    cluster: BackgroundCluster, tmp_path: Path, window: str, late: str
) -> None:
    """Records within the lateness (windows closed, some with no state yet) and beyond
    it: ``window`` emits each window at its close and once more per record within the
    lateness that comes after it, as the reference does; ``window_aggregate`` emits the
    same, so the last result of each window is the same; the same late records pass."""
    got = {}
    for plain in (True, False):
        out = tmp_path / f"out-{plain}"
        params = {"window": window, "late": late, "plain": plain}
        got[plain] = run_in_phases(
            cluster, {**params, "output": str(out), "gates": str(tmp_path / f"gates-{plain}")}
        )
    want, beyond = reference({"window": window, "late": late, "gates": ""})
    assert beyond  # the stream has records beyond the lateness
    assert last_results(got[True][0]) == last_results(got[False][0]) == last_results(want)
    for plain in (True, False):
        assert got[plain][0] == want, (plain, difference(got[plain][0], want))
        assert got[plain][1] == (beyond if late == "emit" else [])


@pytest.mark.slow
def test_late_records_of_a_key_split_over_three_tasks_are_merged_exactly(
    cluster: BackgroundCluster, tmp_path: Path
) -> None:
    """The hot key split over the 3 partial tasks once its first phase is in: its late
    records land in different parts (windows that part has, and has not), each part's
    update is merged again with the others' latest, nothing counted twice."""
    splits = []

    def split_hot_key(job: Any) -> None:
        if splits:
            return
        plan = split_key(job.abstraction, "window", HOT, 3)
        rec = cluster.call(cluster.coordinator.apply_plan(job.id, plan))
        assert rec.status == "completed", rec.error
        splits.append(job.abstraction.operator("window").splits()[HOT])

    params = {"window": "tumbling", "late": "emit", "parallelism": 3}
    got = run_in_phases(
        cluster,
        {**params, "output": str(tmp_path / "out"), "gates": str(tmp_path / "gates")},
        split_hot_key,
    )
    assert len(splits[0]) == 3
    want, beyond = reference({**params, "gates": ""})
    assert last_results(got[0]) == last_results(want)
    assert got[0] == want, difference(got[0], want)
    assert got[1] == beyond
