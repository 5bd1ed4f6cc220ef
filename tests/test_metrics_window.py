"""A metrics window's rates do not depend on how many per-second reports it happens to
hold: reports are stamped when they arrive, so a 2-s window holds one, two or three of a
task's reports, and rates divide by the time those reports cover."""

from __future__ import annotations

import pytest

from controlplane.coordinator.metrics import JobMetrics
from controlplane.engine_views import MetricsView
from controlplane.metrics.service import summarize


def report(records: int, busy: float = 0.4, backpressure: float = 0.1) -> dict:
    """One second of a task that handled ``records``."""
    return {
        "records_in": records,
        "records_out": records,
        "busy_s": busy,
        "backpressure_s": backpressure,
        "idle_s": 1.0 - busy - backpressure,
    }


@pytest.mark.parametrize("reports", [1, 2, 3])
def test_rates_are_per_second_of_reports_whatever_their_number(reports: int) -> None:
    samples = tuple((100.0 + i, "count-0", report(5000)) for i in range(reports))
    view = MetricsView(
        now=100.0 + reports,
        window_s=2.0,
        samples=samples,
        operator_of={"count-0": "count"},
        kinds={"count": "keyed"},
        placement={"count-0": "w1"},
        workers={},
    )
    task = summarize(1, view).tasks[0]
    assert task.in_per_s == pytest.approx(5000)
    assert task.busy == pytest.approx(0.4)
    assert task.backpressure == pytest.approx(0.1)

    metrics = JobMetrics({"count-0": "count"}, {"count": "keyed"})
    for t, task_id, snap in samples:
        metrics.add(t, task_id, snap)
    rates = metrics.window(2.0 if reports < 3 else 3.5, now=100.0 + reports)["tasks"]["count-0"]
    assert rates["in_per_s"] == pytest.approx(5000)
    assert rates["busy"] == pytest.approx(0.4)


def test_a_task_without_time_accounting_falls_back_to_the_window() -> None:
    view = MetricsView(
        now=101.0,
        window_s=2.0,
        samples=((100.0, "src-0", {"records_out": 900}),),
        operator_of={"src-0": "src"},
        kinds={"src": "source"},
        placement={"src-0": "w1"},
        workers={},
    )
    assert summarize(1, view).tasks[0].out_per_s == pytest.approx(450)
