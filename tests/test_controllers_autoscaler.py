"""The latency autoscaler on recorded sequences of views: overload and underload detection
with hysteresis, and the M/M/k sizing."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from controllers_support import rebalanced, task, view_of, window

from controllers import (
    ConfigError,
    LatencyAutoscaler,
    Outcome,
    Plan,
    PlanBuilder,
    SafetyConfig,
    View,
    check_safety,
    decision_of,
)
from controllers.builtin.latency_autoscaler import LatencyAutoscalerConfig, scale_out, stages
from controllers.queueing import P99_OVER_MEAN, sojourn_s
from controlplane.abstraction import Abstraction, apply_plan

A = rebalanced(n_workers=3)  # lines (1) -rebalance-> split (3) -key-> count (2) -fwd-> out (2)
SPLIT_SPEED = 125.0  # records per busy second of one split task
COUNT_SPEED = 1000.0


def period(
    a: Abstraction, rate: float, p99_ms: float | None, *, backlog: int = 0, now: float = 0.0
) -> View:
    """One period: ``rate`` sentences/s from the source, 4 words each into count; each
    split task busy in proportion (saturated at 1: then it serves SPLIT_SPEED and the rest
    waits in its queue, ``backlog`` records per task)."""
    n_split = a.operator("split").parallelism
    n_count = a.operator("count").parallelism
    per_split = min(rate / n_split, SPLIT_SPEED)
    tasks = [task("lines-0", in_per_s=rate)]
    tasks += [
        task(f"split-{i}", in_per_s=per_split, busy=per_split / SPLIT_SPEED, queued=backlog)
        for i in range(n_split)
    ]
    per_count = 4 * per_split * n_split / n_count
    tasks += [
        task(f"count-{i}", in_per_s=per_count, busy=per_count / COUNT_SPEED) for i in range(n_count)
    ]
    tasks += [task(f"out-{i}", in_per_s=per_count, busy=0.001) for i in range(n_count)]
    return view_of(a, window(tasks, p99_ms=p99_ms), now=now)


def run(
    controller: LatencyAutoscaler, a: Abstraction, periods: list[tuple[float, float | None]]
) -> list[Plan | None]:
    """Decisions over ``periods`` of ``(rate, p99)`` on an unchanging abstraction."""
    return [controller.decide(period(a, rate, p99)) for rate, p99 in periods]


def splits(plan: Plan | None, a: Abstraction = A) -> int | None:
    return None if plan is None else apply_plan(a, plan).operator("split").parallelism


OVER, FINE = 900.0, 50.0


def test_overload_needs_more_than_the_factor_of_the_window() -> None:
    c = LatencyAutoscaler({"overload_window": 5, "overload_factor": 0.5})
    plans = run(c, A, [(300, OVER), (300, FINE), (300, OVER), (300, None), (300, OVER)])
    assert plans[:4] == [None] * 4  # 2 of 5 over; a period with no latency does not count
    assert splits(plans[4]) == 4  # 3 of 5 over: one more split task, where it helps most
    assert plans[4] == PlanBuilder(A).scale("split", 4).build()


def test_greedy_sizing_from_the_queueing_model() -> None:
    cfg = LatencyAutoscalerConfig()
    # Saturated split (busy 1, 125/s each) with 3,000 records queued per task: the model
    # sees 375 + 9000/30 = 675/s against 125/s per task, so 5 tasks cannot keep up and 6
    # (rho 0.9) are under the mean target of 500 / ln(100) = 108.6 ms.
    saturated = period(A, 675, OVER, backlog=3000)
    chain = stages(A, saturated.metrics, cfg)
    sizes = {s.operators: k for s, k in scale_out(chain, cfg.model_target_ms).items()}
    assert sizes == {("split",): 6, ("count", "out"): 2}
    split = next(s for s in chain if s.operators == ("split",))
    assert split.latency_ms(5) == float("inf") and split.latency_ms(6) < cfg.model_target_ms
    # Count (with out, forward-connected) is scaled only once its own queue matters.
    hot_count = period(A, 375, OVER)
    tight = LatencyAutoscalerConfig(target_latency_ms=1.5)
    sizes = {s.operators: k for s, k in scale_out(stages(A, hot_count.metrics, tight), 1.5).items()}
    assert sizes[("count", "out")] >= 3


def test_scale_out_plan_respects_caps_and_workers() -> None:
    capped = {"overload_window": 1, "overload_factor": 0, "max_tasks": 3}
    c = LatencyAutoscaler({**capped, "operators": ["split"]})
    assert c.decide(period(A, 675, OVER, backlog=3000)) is None  # split already at 3
    c = LatencyAutoscaler(capped)  # the only task left to add is a count one
    plan = c.decide(period(A, 675, OVER, backlog=3000))
    assert plan == PlanBuilder(A).scale("count", 3).build()
    c = LatencyAutoscaler({"overload_window": 1, "overload_factor": 0, "workers": ["new"]})
    plan = c.decide(period(A, 675, OVER, backlog=3000))
    b = apply_plan(A, plan)  # type: ignore[arg-type]
    assert b.operator("split").parallelism == 6
    assert [t.worker for t in b.operator("split").tasks[3:]] == ["new-1", "new-2", "new-3"]


def test_underload_needs_a_streak_below_the_watermark() -> None:
    c = LatencyAutoscaler({"underload_window": 3, "low_watermark": 0.5})
    high = [(300, FINE)] * 4
    plans = run(c, A, [*high, (100, FINE), (100, FINE), (100, OVER), (100, FINE), (100, FINE)])
    assert plans == [None] * 9  # the over-limit probe broke the streak
    plan = c.decide(period(A, 100, FINE))  # third low period in a row
    # 100/s: one split task (rho 0.8, 40 ms) and one count task suffice under 0.8 x target.
    assert plan is not None
    b = apply_plan(A, plan)
    assert (b.operator("split").parallelism, b.operator("count").parallelism) == (1, 1)
    assert c.decide(period(A, 149, FINE)) is not None  # still below 150: the streak goes on


def test_scale_in_keeps_utilization_headroom() -> None:
    c = LatencyAutoscaler({"underload_window": 1, "max_utilization": 0.5})
    run(c, A, [(300, FINE)])
    plan = c.decide(period(A, 100, FINE))  # 100/s at 125/s per task: 2 tasks for rho <= 0.5
    assert splits(plan) == 2


def test_hysteresis_after_a_change_of_parallelism() -> None:
    c = LatencyAutoscaler({"overload_window": 3, "overload_factor": 0.5})
    plans = run(c, A, [(300, OVER), (300, OVER)])
    assert plans[1] is not None and splits(plans[1]) == 4
    b = apply_plan(A, plans[1])
    # The next views show 4 split tasks: the overload window starts again.
    assert c.decide(period(b, 300, OVER)) is None
    nxt = c.decide(period(b, 300, OVER))
    assert nxt is not None and splits(nxt, b) == 5
    # Underload right after the change needs its whole streak again, and the peak is kept.
    c2 = LatencyAutoscaler({"underload_window": 2})
    run(c2, A, [(300, FINE), (100, FINE)])
    assert c2.decide(period(b, 100, FINE)) is None  # shape changed: streak restarts
    assert c2.decide(period(b, 100, FINE)) is not None


def test_steady_load_changes_nothing() -> None:
    c = LatencyAutoscaler()
    assert run(c, A, [(300, FINE)] * 40) == [None] * 40


def test_autoscaler_config_is_checked() -> None:
    assert LatencyAutoscalerConfig(max_latency_ms=460.517).model_target_ms == pytest.approx(
        100, rel=1e-4
    )
    for bad, fragment in [
        ({"overload_factor": 1.0}, "config.overload_factor: must be in [0, 1)"),
        ({"overload_window": 0}, "config.overload_window: must be >= 1"),
        ({"max_utilization": 0}, "config.max_utilization: must be in (0, 1]"),
        ({"target_latency_ms": -5}, "config.target_latency_ms: must be > 0"),
    ]:
        with pytest.raises(ConfigError) as info:
            LatencyAutoscaler(bad)
        assert fragment in str(info.value)


def simulate(a: Abstraction, rate: float, backlog: float) -> tuple[View, float]:
    """One 10 s period of a fluid queue in front of split (SPLIT_SPEED per task; 2 words a
    sentence, which count keeps up with): the view it shows and the backlog it leaves. p99
    is the model's (4.6 x the mean sojourn) while split keeps up, and the backlog's wait
    when it does not."""
    k = a.operator("split").parallelism
    served = min(rate + backlog / 10, k * SPLIT_SPEED)
    backlog = max(0.0, backlog + (rate - served) * 10)
    per = served / k
    kc = a.operator("count").parallelism
    tasks = [task("lines-0", in_per_s=rate)]
    tasks += [
        task(f"split-{i}", in_per_s=per, busy=per / SPLIT_SPEED, queued=round(backlog / k))
        for i in range(k)
    ]
    words = 2 * served / kc
    tasks += [task(f"count-{i}", in_per_s=words, busy=words / COUNT_SPEED) for i in range(kc)]
    if backlog > 0:
        p99 = 1000.0 * backlog / served
    else:
        mean_s = sojourn_s(rate, SPLIT_SPEED, k) + sojourn_s(2 * rate, COUNT_SPEED, kc)
        p99 = 1000.0 * P99_OVER_MEAN * mean_s
    return view_of(a, window(tasks, p99_ms=p99)), backlog


def test_follows_a_rate_step_under_the_safety_limits() -> None:
    """200/s, then 600/s (split needs 5 tasks of 125/s), then 150/s: the autoscaler scales
    out soon after the step, never in while the rate is high, and back in after it; the
    host's safety limits (a minute of cooldown) hold every plan."""
    controller = LatencyAutoscaler({"overload_window": 3, "underload_window": 6})
    safety = SafetyConfig(cooldown_s=60.0, max_parallelism={"*": 12})
    a, backlog, history = A, 0.0, []
    sizes = []
    schedule = [200.0] * 10 + [600.0] * 30 + [150.0] * 40
    for period_index, rate in enumerate(schedule):
        now = 10.0 * period_index
        view, backlog = simulate(a, rate, backlog)
        view = replace(view, now=now, history=tuple(history))
        plan = decision_of(controller.decide(view), view)
        if plan is not None:
            verdict = check_safety(plan, a, safety, history, now=now)
            status = "completed" if verdict.action == "apply" else "refused"
            if verdict.allowed:
                a = apply_plan(a, plan)
            history.append(Outcome(now, plan, status, verdict.reason, verdict.moves))
            controller.on_result(history[-1])
        sizes.append(a.operator("split").parallelism)
    # Recorded run: 3 x10, 5 at period 11, 6 at 17 (the backlog of the step still drained
    # slowly; the plan of period 13 waited out the cooldown), 2 at period 45.
    assert sizes[:10] == [3] * 10  # steady at 200/s
    assert max(sizes[10:40]) >= 5 and sizes[15] >= 5  # out within five periods of the step
    assert all(x <= y for x, y in itertools.pairwise(sizes[10:40]))  # never in under load
    assert sizes[-1] <= 2 < sizes[39]  # back in after the rate fell
    changes = sum(x != y for x, y in itertools.pairwise(sizes))
    assert changes <= 4, sizes
    refused = [o for o in history if o.status == "refused"]
    assert refused and all("cooldown" in (o.error or "") for o in refused)
