"""Built-ins on views recorded from a real run (tests/data/controllers/wordcount_skew.json):
a skewed word count on two local workers, before and after the load balancer's plan was
applied by the control plane (see the file's ``note``)."""

from __future__ import annotations

import json
from pathlib import Path

from controllers import DscPlacement, LatencyAutoscaler, LoadBalancer, View
from controlplane.abstraction import apply_plan, imbalance

RECORDED = json.loads((Path(__file__).parent / "data/controllers/wordcount_skew.json").read_text())
BEFORE = View.from_dict(RECORDED["before"])
AFTER = View.from_dict(RECORDED["after"])


def count_imbalance(v: View) -> float:
    loads = v.metrics.key_group_loads("count")
    per_task = [
        sum(loads.get(g, 0.0) for g in t.workload.key_groups or ())
        for t in v.abstraction.operator("count").tasks
    ]
    return imbalance(per_task)


def test_recorded_views_round_trip() -> None:
    for v in (BEFORE, AFTER):
        assert View.from_dict(json.loads(json.dumps(v.to_dict()))) == v
    assert (BEFORE.abstraction.version, AFTER.abstraction.version) == (1, 2)
    assert AFTER.history[0].status == "completed"


def test_load_balancer_on_the_recorded_run() -> None:
    assert count_imbalance(BEFORE) > 0.2  # Zipf 1.2 over 16 key groups: 7351 vs 4663 words/s
    plan = LoadBalancer().decide(BEFORE)
    assert plan == AFTER.history[0].plan  # what was decided then and applied for real
    result = apply_plan(BEFORE.abstraction, plan)
    assert result.operators == AFTER.abstraction.operators
    assert count_imbalance(AFTER) < 0.05  # measured after the change: 6073 vs 5959
    assert LoadBalancer().decide(AFTER) is None


def test_other_builtins_leave_the_recorded_run_alone() -> None:
    assert DscPlacement().decide(BEFORE) is None  # forward pairs already share workers
    autoscaler = LatencyAutoscaler({"overload_window": 1, "overload_factor": 0.0})
    assert BEFORE.metrics.latency.p99_ms < 500
    assert [autoscaler.decide(v) for v in (BEFORE, AFTER)] == [None, None]
