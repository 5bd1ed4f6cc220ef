"""The series behind the console's charts (``controlplane.metrics.series``, pure): steps
aligned on multiples of ``step_s``, per-step operator rates and levels, sink latency, the
key-group heat map and worker usage, from hand-made reports; and the worker history the
coordinator keeps for it."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_metrics_window import report as one_second

from controlplane.coordinator.metrics import WINDOW_S, JobMetrics
from controlplane.engine_views import MetricsView
from controlplane.errors import InvalidRequest
from controlplane.metrics.series import series, steps
from runtime.metrics import LatencyHistogram

OPERATOR_OF = {"src-0": "src", "count-0": "count", "count-1": "count", "sink-0": "sink"}
KINDS = {"src": "source", "count": "keyed", "sink": "sink"}


def report(records: int, busy: float = 0.5, backpressure: float = 0.0, **extra: Any) -> dict:
    """One second of a task that took and gave ``records``, with ``extra`` fields."""
    return {**one_second(records, busy, backpressure), **extra}


def view(samples: list[tuple[float, str, dict]], now: float, window_s: float, **extra: Any):
    return MetricsView(
        now=now,
        window_s=window_s,
        samples=tuple(samples),
        operator_of=OPERATOR_OF,
        kinds=KINDS,
        placement={},
        workers={},
        **extra,
    )


def latency(*ms: int) -> dict:
    h = LatencyHistogram()
    for x in ms:
        h.record_us(x * 1000)
    return h.to_dict()


def test_steps_end_on_multiples_of_the_step_and_none_is_partial() -> None:
    assert steps(1003.5, 10.0, 2.0) == [994.0, 996.0, 998.0, 1000.0, 1002.0]
    assert steps(1004.0, 4.0, 2.0) == [1002.0, 1004.0]
    assert steps(1004.0, 5.0, 2.5) == [1000.0, 1002.5]
    assert steps(10.0, 3.0, 3.0) == [9.0]


@pytest.mark.parametrize(
    ("window_s", "step_s", "message"),
    [
        (300.0, 0.5, "step_s must be at least 1 seconds, not 0.5"),
        (10.0, 20.0, "step_s (20) must not be longer than window_s (10)"),
    ],
)
def test_steps_refuse_what_makes_no_series(window_s: float, step_s: float, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message.replace("(", r"\(").replace(")", r"\)")):
        steps(1000.0, window_s, step_s)


def test_operators_per_step_rates_levels_and_gaps() -> None:
    samples = [
        (100.0, "count-0", report(100)),  # before the steps: where count-0's next one starts
        (100.5, "src-0", report(1000, queued={})),  # a task's first: the 1 s it accounts for
        (101.0, "count-0", report(300, busy=0.2, key_groups={3: 200, 7: 100}, queued={"a": 5})),
        (101.5, "count-1", report(200, busy=0.9, backpressure=0.1, key_groups={9: 200})),
        (102.0, "count-0", report(500, busy=0.4, key_groups={3: 500}, queued={"a": 2})),
        (102.0, "sink-0", report(1000, latency=latency(10, 20, 30, 40))),  # the step's end
        # Step ending 104: nothing. Step ending 106: the sink, 3 s after its previous report.
        (105.0, "sink-0", report(700)),
    ]
    out = series(1, view(samples, now=107.0, window_s=6.0), step_s=2.0)
    assert out.times == [102.0, 104.0, 106.0]
    ops = {o.operator: o for o in out.operators}
    assert list(ops) == ["src", "count", "sink"]  # the graph's order

    assert ops["src"].out_per_s == [1000.0, None, None]
    assert ops["src"].p99_ms is None
    count = ops["count"]
    assert count.in_per_s == [pytest.approx(400 + 200), None, None]  # 800 in 2 s, 200 in 1 s
    assert count.busy == [pytest.approx((0.3 + 0.9) / 2), None, None]
    assert count.backpressure == [pytest.approx(0.05), None, None]
    assert count.queued == [2, None, None]  # count-0's latest level, count-1 reports none
    sink = ops["sink"]
    assert sink.in_per_s == [1000.0, None, pytest.approx(700 / 3, abs=0.01)]
    assert sink.p99_ms is not None and sink.p99_ms[1:] == [None, None]
    assert 40 <= sink.p99_ms[0] <= 45  # the histogram's ~6% buckets

    (heat,) = out.key_groups
    assert heat.operator == "count" and heat.groups == [3, 7, 9]
    assert heat.records_per_s == [[350.0, 0.0, 0.0], [50.0, 0.0, 0.0], [200.0, 0.0, 0.0]]


def test_a_report_covers_the_time_since_the_previous_whatever_it_accounts_for() -> None:
    """A source on a loaded worker: most of its time is spent yielding to the worker's
    other tasks, in none of busy, idle and backpressured; its reports come late."""
    starved = {"records_out": 4000, "busy_s": 0.02, "idle_s": 0.01, "backpressure_s": 0.0}
    samples = [(101.0, "src-0", starved), (103.5, "src-0", starved)]
    out = series(1, view(samples, now=104.0, window_s=4.0), step_s=2.0)
    (src,) = [o for o in out.operators if o.operator == "src"]
    # The first in the view: not 4000 in 0.03 s, but in at least the 1 s between reports.
    assert src.out_per_s == [4000.0, 1600.0]  # then 4000 in 2.5 s
    assert src.busy == [pytest.approx(0.02), pytest.approx(0.02 / 2.5)]


def test_reports_outside_the_steps_are_left_out() -> None:
    samples = [(100.0 + k, "src-0", report(n)) for k, n in enumerate((5, 7, 9, 11))]
    out = series(1, view(samples, now=103.0, window_s=2.0), step_s=1.0)
    assert out.times == [102.0, 103.0]
    assert next(o for o in out.operators if o.operator == "src").out_per_s == [9.0, 11.0]


def test_workers_cpu_is_the_step_s_mean_and_rss_its_latest() -> None:
    usage = ((100.5, "w1", 50.0, 100.0), (101.5, "w1", 70.0, 120.0), (105.5, "w2", 10.0, 80.0))
    out = series(1, view([], now=106.0, window_s=6.0, worker_samples=usage), step_s=2.0)
    assert [(w.worker, w.cpu_percent, w.rss_mb) for w in out.workers] == [
        ("w1", [60.0, None, None], [120.0, None, None]),
        ("w2", [None, None, 10.0], [None, None, 80.0]),
    ]
    assert all(o.in_per_s == [None, None, None] for o in out.operators)  # no task reported


@given(
    start=st.floats(0.0, 10.0, allow_nan=False),
    counts=st.lists(st.integers(0, 10_000), max_size=60),
    step_s=st.sampled_from([1.0, 2.0, 2.5, 5.0]),
)
def test_each_report_counts_in_the_one_step_holding_it(
    start: float, counts: list[int], step_s: float
) -> None:
    """Reports a second apart: a step holding any has their mean rate (to the hundredth the
    series rounds to), whatever their number and wherever the steps fall; the others are
    gaps."""
    now = 1070.0
    samples = [(1000.0 + start + k, "src-0", report(n)) for k, n in enumerate(counts)]
    out = series(1, view(samples, now=now, window_s=60.0), step_s=step_s)
    ends = out.times
    assert len(ends) == math.floor(60.0 / step_s) and ends[-1] <= now
    held: list[list[int]] = [[] for _ in ends]
    for t, _, snap in samples:
        for i, end in enumerate(ends):
            if end - step_s < t <= end:
                held[i].append(snap["records_out"])
    line = next(o for o in out.operators if o.operator == "src").out_per_s
    assert line == [pytest.approx(sum(xs) / len(xs), abs=0.005) if xs else None for xs in held]


def test_the_coordinator_keeps_worker_usage_for_its_window() -> None:
    metrics = JobMetrics({"src-0": "src"}, {"src": "source"})
    metrics.add_worker("w1", 20.0, 90.0, now=1000.0)
    metrics.add_worker("w1", 30.0, 95.0, now=1001.0)
    metrics.add_worker("w2", 5.0, 60.0, now=1000.0 + WINDOW_S + 0.5)
    assert list(metrics.worker_samples) == [
        (1001.0, "w1", 30.0, 95.0),
        (1000.0 + WINDOW_S + 0.5, "w2", 5.0, 60.0),
    ]
    assert metrics.workers == {
        "w1": {"cpu_percent": 30.0, "rss_mb": 95.0},
        "w2": {"cpu_percent": 5.0, "rss_mb": 60.0},
    }
