"""The Flink Kubernetes operator autoscaler's decision rule: nothing before the
stabilization interval and a full metrics window, the documented scaling formula on a
worked example, utilization bounds, delayed scale-down and key-group alignment."""

from __future__ import annotations

from dataclasses import replace

import pytest
from controllers_support import rebalanced, task, view_of, window

from controllers import ConfigError, Outcome, PlanBuilder, View
from controllers.builtin import BUILTINS, FlinkAutoscaler, FlinkAutoscalerConfig
from controllers.builtin.flink_autoscaler import Observation, align, evaluate
from controlplane.abstraction import Abstraction, apply_plan
from controlplane.metrics.schemas import PartitionHealth

A = rebalanced(n_workers=3)  # lines (1) -rebalance-> split (3) -key-> count (2, 8) -fwd-> out (2)
DT = 2.0
SHORT = {"interval_s": DT, "stabilization_interval_s": 4.0, "metrics_window_s": 10.0}


def view(
    a: Abstraction, now: float, *, lag: int = 0, split_busy: float = 0.5, count_busy: float = 1.0
) -> View:
    """The source emits 1,000 lines/s (``lag`` records behind); split turns each into 4
    words at ``split_busy`` (its busiest task), count takes the 4,000 words/s at
    ``count_busy``."""
    k_split, k_count = a.operator("split").parallelism, a.operator("count").parallelism
    source = task("lines-0", in_per_s=0.0).model_copy(
        update={"out_per_s": 1000.0, "partitions": {"p0": PartitionHealth(lag=lag, stalled=None)}}
    )
    tasks = [source]
    tasks += [
        task(f"split-{i}", in_per_s=1000.0 / k_split, busy=split_busy).model_copy(
            update={"out_per_s": 4000.0 / k_split}
        )
        for i in range(k_split)
    ]
    tasks += [
        task(f"count-{i}", in_per_s=4000.0 / k_count, busy=count_busy) for i in range(k_count)
    ]
    tasks += [task(f"out-{i}", in_per_s=4000.0 / k_count, busy=0.01) for i in range(k_count)]
    return replace(view_of(a, window(tasks, p99_ms=80.0)), now=now)


def test_worked_example_of_the_documented_formula() -> None:
    """Six observations 2 s apart (a 10 s window). The source emits 1,000/s while its lag
    grows from 0 to 5,000: target data rate 1,000 + 500 = 1,500/s, catch-up rate 5,000 /
    1,800 s = 2.78/s; split's output ratio is 4.

    - split (3 tasks, 1,000/s in, busiest task busy 0.5): TPR 2,000/s. Target capacity
      round(2.78 + 1,500 x 300 / 1,800 + 1,500 / 0.7) = 2,396; factor 1.198; ceil(3 x
      1.198) = 4 tasks. Bounds [round(2.78 + 1,500 / 1.0), round(2.78 + 250 + 1,500 / 0.4)]
      = [1,503, 4,003] hold 2,000: within.
    - count (2 tasks, 4,000/s in, busy 1.0): TPR 4,000/s. Target capacity round(11.11 +
      1,000 + 6,000 / 0.7) = 9,583; factor 2.396; ceil(4.79) = 5, aligned to a divisor of
      its 8 key groups: 8. Its scale-up threshold, 6,011, is above its TPR: outside.

    One vertex outside its bounds: every change is applied, in one plan."""
    cfg = FlinkAutoscalerConfig(**SHORT)
    obs = [Observation.of(A, view(A, t, lag=500 * int(t)).metrics, t) for t in range(0, 11, 2)]
    assert obs[0].true_processing_rate("split") == 2000.0
    assert cfg.capacity(1500.0, 5000 / 1800, 0.7, restart=True) == 2396.0
    assert evaluate(A, obs, cfg) == {("split",): (4, False), ("count", "out"): (8, True)}
    c = FlinkAutoscaler(SHORT)
    plans = [c.decide(view(A, t, lag=500 * max(0, int(t) - 4))) for t in range(0, 15, 2)]
    assert plans[:-1] == [None] * 7
    assert plans[-1] == PlanBuilder(A).scale("split", 4).scale("count", 8).build()


def test_nothing_before_stabilization_and_a_full_window() -> None:
    """Collection starts 4 s after the first view (stabilization), evaluation once it has
    covered the 10 s window: the first decision at 14 s, and after it is applied nothing
    again for as long (the job restarted)."""
    c = FlinkAutoscaler(SHORT)
    plans = [c.decide(view(A, t, lag=1000 * int(t))) for t in range(0, 15, 2)]
    assert plans[:-1] == [None] * 7
    plan = plans[-1]
    assert plan is not None
    c.on_result(Outcome(14.5, plan, "completed"))
    b = apply_plan(A, plan)
    after = [c.decide(view(b, t, lag=1000 * int(t))) for t in range(16, 29, 2)]
    assert after == [None] * 7
    # With the documented defaults (5 min + 15 min, a decision a minute), a two-minute run
    # never sees a decision, however overloaded.
    c = FlinkAutoscaler()
    assert c.interval_s == 60.0
    assert [c.decide(view(A, t, lag=1000 * int(t))) for t in (0.0, 60.0, 120.0)] == [None] * 3


def test_within_bounds_changes_nothing() -> None:
    """Count at busy 0.8 (TPR 5,000) for a target of 4,000/s: Flink's formula asks 4 tasks
    (6,381 / 5,000 x 2, aligned to 8 key groups), but 5,000 is within [4,000, 10,667]
    and so is split: nothing is done."""
    c = FlinkAutoscaler(SHORT)
    assert [c.decide(view(A, t, count_busy=0.8)) for t in range(0, 31, 2)] == [None] * 16


def test_delayed_scale_down() -> None:
    """An idle job: every operator recommends scaling down to 40% (scale-down.max-factor
    0.6). The first recommendation only opens the scale-down interval; once it has passed
    the largest recommendation within it is applied. With the default hour, never here."""
    cfg = {**SHORT, "scale_down_interval_s": 6.0}
    idle = at(A, 6, 4)
    c = FlinkAutoscaler(cfg)
    plans = [c.decide(view(idle, t, split_busy=0.05, count_busy=0.05)) for t in range(0, 21, 2)]
    assert plans[:10] == [None] * 10  # 14 s: first recommendation; 20 s: 6 s later
    assert plans[10] == PlanBuilder(idle).scale("split", 3).scale("count", 2).build()
    c = FlinkAutoscaler(SHORT)
    assert all(
        c.decide(view(idle, t, split_busy=0.05, count_busy=0.05)) is None for t in range(0, 200, 2)
    )


def at(a: Abstraction, split: int, count: int) -> Abstraction:
    plan = PlanBuilder(a).scale("split", split).scale("count", count).build()
    return a if plan is None else apply_plan(a, plan)


def test_key_group_alignment() -> None:
    assert align(5, 2, 8, 1, 200) == 8  # up to the next divisor of the key groups
    assert align(3, 6, 8, 1, 200) == 4  # a scale-down searches up to the current tasks
    assert align(7, 6, 8, 1, 200) == 8
    assert align(3, 2, 8, 1, 3) == 2  # no divisor within the cap 3 and 2 would not be up
    # No divisor of 120 in [50, 55]: down to where a task's share grows (40 divides).
    assert align(50, 10, 120, 1, 55) == 40
    assert align(50, 10, 128, 1, 55) == 43  # 128 // 42 = 3 > 2; 42 does not divide: 43


def test_registered_defaults_and_config_checked() -> None:
    assert BUILTINS["flink_autoscaler"] is FlinkAutoscaler
    cfg = FlinkAutoscalerConfig()
    assert (cfg.metrics_window_s, cfg.stabilization_interval_s) == (900.0, 300.0)
    assert (cfg.target_utilization, cfg.target_utilization_boundary) == (0.7, 0.3)
    assert (cfg.scale_up_max_factor, cfg.scale_down_max_factor) == (100000.0, 0.6)
    assert (cfg.catch_up_duration_s, cfg.restart_time_s) == (1800.0, 300.0)
    assert (cfg.scale_down_interval_s, cfg.vertex_max_parallelism) == (3600.0, 200)
    for bad, fragment in [
        ({"metrics_window_s": -1}, "config.metrics_window_s: must be >= 0 seconds"),
        ({"target_utilization": 1.5}, "config.target_utilization: must be in (0, 1]"),
        ({"scale_down_max_factor": 2}, "config.scale_down_max_factor: must be in [0, 1]"),
        ({"vertex_max_parallelism": 0}, "config.vertex_max_parallelism: must be >= "),
        ({"stabilization": 5}, "config.stabilization: unknown field"),
    ]:
        with pytest.raises(ConfigError) as info:
            FlinkAutoscaler(bad)
        assert fragment in str(info.value)
