"""The windowed aggregation whose hot keys split, without running it: what it refuses to
build (saying what to use instead), a ``splitKey`` on its partial operator validated and
one on a plain window refused, and the load balancer splitting its hot key."""

from __future__ import annotations

from typing import Any

import pytest
from controllers_support import JOB, task, view_of, window
from test_abstraction import deploy

from controllers import LoadBalancer, SplitKey
from controlplane.abstraction import Abstraction, InvalidPlan, apply_plan, split_key
from runtime.dataflow import Dataflow, DataflowError, load_job
from runtime.keygroups import key_group
from runtime.sources import Generator
from runtime.windows import Aggregate, Count, CountWindow, Session, Tumbling
from tests.window_split_jobs import HOT

MP = 128  # the jobs' default key groups


class NoMerge(Aggregate):
    def create(self) -> int:
        return 0

    def add(self, acc: int, record: Any) -> int:
        return acc + 1


def window_fn(key: Any, start: float, end: float, records: list) -> list:
    return [(key, len(records))]


def build(assigner: Any, aggregate: Any, **kw: Any) -> None:
    flow = Dataflow("refused")
    keyed = flow.source("s", Generator(records=10)).key_by(str)
    keyed.window_aggregate("w", assigner, aggregate, **kw)


@pytest.mark.parametrize(
    ("assigner", "aggregate", "kw", "says"),
    [
        (Session(1.0), Count(), {}, "use window(...)"),
        (CountWindow(10), Count(), {}, "use window(...)"),
        (Tumbling(1.0), Count(), {"time": "processing"}, "window(..., time='processing')"),
        (Tumbling(1.0), window_fn, {}, "window(..., apply=fn)"),
        (Tumbling(1.0), NoMerge(), {}, "NoMerge has no merge(a, b)"),
        (Tumbling(1.0), Count(), {"allowed_lateness_s": -1}, "allowed_lateness_s must be >= 0"),
    ],
)
def test_what_cannot_split_is_refused_when_the_job_is_built(
    assigner: Any, aggregate: Any, kw: dict[str, Any], says: str
) -> None:
    with pytest.raises(DataflowError, match="operator 'w'") as info:
        build(assigner, aggregate, **kw)
    assert says in str(info.value)


def windowed(plain: bool = False, parallelism: int = 3) -> Abstraction:
    """events -> window (3 tasks, window_aggregate or, ``plain``, window) -> out."""
    params = {"output": "out", "parallelism": parallelism, "plain": plain}
    graph = load_job("tests.window_split_jobs:split_window_job", params)
    return deploy(graph, n_workers=parallelism).replace(job_id=JOB)


def test_a_split_of_the_partial_window_operator_is_valid_and_of_a_plain_window_refused() -> None:
    a = windowed()
    assert a.operator("window").combinable and not a.operator("window.merge").combinable
    split = apply_plan(a, split_key(a, "window", HOT, 3))
    parts = split.operator("window").splits()[HOT]
    assert len(parts) == 3 and parts[0] == key_group(HOT, MP)
    plain = windowed(plain=True)
    with pytest.raises(InvalidPlan, match="not a combinable aggregation") as info:
        apply_plan(plain, split_key(plain, "window", HOT, 2))
    assert "window_aggregate" in str(info.value)
    with pytest.raises(InvalidPlan, match="not a combinable aggregation"):
        apply_plan(a, split_key(a, "window.merge", HOT, 2))


def test_the_load_balancer_splits_a_hot_key_of_the_partial_window_operator() -> None:
    """Its owner's sketch reports the hot key at 800 of the 1,000 records per busy
    second the task can take: split over its owner and the idlest other task."""
    a = windowed()
    op = a.operator("window")
    owner = op.owner_of_key(HOT)
    idle, busy = [t for t in op.task_ids if t != owner]
    loads = {owner: 900.0, idle: 100.0, busy: 500.0}
    doc = window(
        task(
            t.id,
            groups={g: loads[t.id] / len(t.workload.key_groups) for g in t.workload.key_groups},
            busy=loads[t.id] / 1000.0,
            worker=t.worker,
        )
        for t in op.tasks
    )
    for entry in doc["tasks"]:
        if entry["task"] == owner:
            entry["hot_keys"] = [
                {
                    "key": HOT,
                    "group": key_group(HOT, MP),
                    "per_s": 800.0,
                    "error_per_s": 0.0,
                    "share": 800.0 / entry["in_per_s"],
                }
            ]
    plan = LoadBalancer({"threshold": 10.0, "target": 1.0}).decide(view_of(a, doc))
    assert plan is not None and plan.ops == (SplitKey("window", HOT, (owner, idle)),)
