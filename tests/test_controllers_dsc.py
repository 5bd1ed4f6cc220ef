"""DSC placement on recorded traffic: channel classes, clusters under the capacity bound,
and the assignResource plans."""

from __future__ import annotations

from dataclasses import replace

import pytest
from controllers_support import task, view_of, window, wordcount

from controllers import AssignResource, DscPlacement, Plan
from controllers.builtin.dsc_placement import (
    DscPlacementConfig,
    classify,
    clusters,
    cross_traffic,
    place,
)
from controlplane.abstraction import Abstraction, apply_plan

# Word count on two workers of 4 slots: task i of every operator on w{i}.
GOOD = wordcount(parallelism=2, n_workers=2, slots=4)
# The same with the two split tasks swapped: each is away from its source (forward) task.
SWAP = (AssignResource("split", "split-0", "w1"), AssignResource("split", "split-1", "w0"))
BAD = apply_plan(GOOD, Plan(GOOD.version, SWAP))
TRAFFIC = {  # bytes/s: sentences are big, words smaller, counts small
    ("sentences-0", "split-0"): 1000.0,
    ("sentences-1", "split-1"): 1000.0,
    ("split-0", "count-0"): 200.0,
    ("split-0", "count-1"): 200.0,
    ("split-1", "count-0"): 200.0,
    ("split-1", "count-1"): 200.0,
    ("count-0", "sink-0"): 50.0,
    ("count-1", "sink-1"): 50.0,
}


def view(a: Abstraction, traffic: dict = TRAFFIC, busy: float = 0.1):
    tasks = [
        task(t.id, in_per_s=100.0, busy=busy, worker=t.worker)
        for op in a.operators
        for t in op.tasks
    ]
    return view_of(a, window(tasks, traffic=traffic))


def test_classes_use_mean_and_mean_absolute_deviation() -> None:
    c = classify(TRAFFIC)
    assert c.mean == 362.5 and c.mad == 318.75  # high above 681.25, low below 43.75
    assert c.high == (("sentences-0", "split-0"), ("sentences-1", "split-1"))
    assert len(c.medium) == 6 and c.low == ()
    assert c.medium[:4] == tuple(sorted(k for k, v in TRAFFIC.items() if v == 200.0))
    narrow = classify(TRAFFIC, deviation=0.1)  # bands at 362.5 +- 31.9
    assert len(narrow.high) == 2 and narrow.medium == () and len(narrow.low) == 6
    flat = classify({("a-0", "b-0"): 5.0, ("a-1", "b-1"): 5.0})
    assert flat.high == flat.low == () and len(flat.medium) == 2
    assert classify({}).mean == 0.0


def test_clusters_follow_high_then_medium_channels_under_the_bound() -> None:
    tasks = [t.id for op in BAD.operators for t in op.tasks]
    groups = clusters(tasks, TRAFFIC, {}, lambda n, _busy: n <= 4)
    assert groups == [
        ["sentences-0", "split-0", "count-0", "count-1"],  # high, then the busiest medium
        ["sentences-1", "split-1"],  # high; a medium merge would make 6 tasks
        ["sink-0"],
        ["sink-1"],
    ]
    pairs = clusters(tasks, TRAFFIC, {}, lambda n, _busy: n <= 2)
    assert pairs == [  # the medium count -> sink channels can still pair up
        ["sentences-0", "split-0"],
        ["sentences-1", "split-1"],
        ["count-0", "sink-0"],
        ["count-1", "sink-1"],
    ]
    assert sorted(t for g in pairs for t in g) == sorted(tasks)


CASES = [
    # (name, abstraction, traffic, config, expected plan or None)
    (
        "split away from its source: high clusters come back together",
        BAD,
        TRAFFIC,
        {"alpha": 1.0},
        Plan(
            BAD.version,
            (
                AssignResource("split", "split-0", "w0"),
                AssignResource("split", "split-1", "w1"),
                AssignResource("count", "count-1", "w0"),
                AssignResource("sink", "sink-0", "w1"),
            ),
        ),
    ),
    ("already co-located: 400 of 2900 B/s cross, no better placement", GOOD, TRAFFIC, {}, None),
    ("gain below min_gain", BAD, TRAFFIC, {"alpha": 1.0, "min_gain": 0.7}, None),
    ("no traffic measured", BAD, {}, {}, None),
]


@pytest.mark.parametrize(
    ("name", "a", "traffic", "config", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_dsc_table(
    name: str, a: Abstraction, traffic: dict, config: dict, expected: Plan | None
) -> None:
    plan = DscPlacement(config).decide(view(a, traffic))
    assert plan == expected
    if plan is not None:
        b = apply_plan(a, plan)
        now = {t.id: t.worker for op in b.operators for t in op.tasks}
        before = {t.id: t.worker for op in a.operators for t in op.tasks}
        assert cross_traffic(now, traffic) == 500.0 < cross_traffic(before, traffic) == 2400.0
        assert DscPlacement(config).decide(view(b, traffic)) is None  # stable


def test_capacity_bound_alpha() -> None:
    # alpha 0.5 of 4 slots: clusters of at most 2 tasks, the pairs above.
    cfg = DscPlacementConfig(alpha=0.5)
    result = place(BAD, TRAFFIC, {}, cfg)
    assert result["sentences-0"] == result["split-0"] and result["sentences-1"] == result["split-1"]
    assert result["sentences-0"] != result["sentences-1"]  # two clusters of 2 on 2 workers
    assert sorted(list(result.values()).count(w) for w in ("w0", "w1")) == [4, 4]
    # The CPU bound: at 0.3 busy each, alpha 0.8 of one CPU holds a pair (0.6), not three
    # tasks (0.9), although 3 slots (0.8 x 4) would: the clusters are the pairs again, and
    # the two source pairs cannot share a worker.
    busy = {t: 0.3 for t in result}
    cpu = place(BAD, TRAFFIC, busy, DscPlacementConfig(alpha=0.8))
    assert cpu["sentences-0"] == cpu["split-0"] != cpu["sentences-1"] == cpu["split-1"]
    assert sorted(list(cpu.values()).count(w) for w in ("w0", "w1")) == [4, 4]


def test_rest_is_balanced_on_alive_workers() -> None:
    a = wordcount(parallelism=2, n_workers=3, slots=8)  # w2 idle
    dead = a.replace(
        workers=tuple(replace(w, status="dead") if w.id == "w1" else w for w in a.workers)
    )
    result = place(dead, {("split-0", "count-0"): 10.0}, {}, DscPlacementConfig())
    assert result["split-0"] == result["count-0"]  # the only channel is the only cluster
    counts = {w: list(result.values()).count(w) for w in ("w0", "w1", "w2")}
    assert counts == {"w0": 4, "w1": 0, "w2": 4}  # the dead worker's tasks spread evenly
    assert {t for t, w in result.items() if w == "w2"} >= {"sentences-1", "split-1"}
