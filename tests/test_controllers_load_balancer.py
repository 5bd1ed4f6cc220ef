"""The load balancer on recorded views: a table of view -> expected plan."""

from __future__ import annotations

import pytest
from controllers_support import owners, rebalanced, task, view_of, window, wordcount

from controllers import ConfigError, LoadBalancer, Plan, rebalance
from controllers.builtin.load_balancer import proportional_balance
from controlplane.abstraction import AssignWorkload, apply_plan, diff, imbalance

A = wordcount(parallelism=2, max_parallelism=16)  # count-0: 0-7 on w0, count-1: 8-15 on w1
EVEN = {g: 10.0 for g in range(16)}
HOT = {g: 40.0 if g < 4 else 10.0 for g in range(16)}  # count-0: 200/s, count-1: 80/s


def counts(loads: dict[int, float], speed: tuple[float, float]) -> list:
    """count-0 and count-1 reporting ``loads`` by owner, each busy at load / speed."""
    mine = [{g: v for g, v in loads.items() if (g < 8) == (i == 0)} for i in (0, 1)]
    return [
        task(f"count-{i}", groups=mine[i], busy=sum(mine[i].values()) / speed[i], worker=f"w{i}")
        for i in (0, 1)
    ]


def keyed(workload: dict[str, range | list[int]]) -> Plan:
    return Plan(A.version, (AssignWorkload("count", {t: list(g) for t, g in workload.items()}),))


CASES = [
    # (name, tasks of the metrics window, config, expected plan or None)
    ("balanced", counts(EVEN, (400, 400)), {}, None),
    (
        "skewed, equal speeds: the abstraction's rebalance, down to the target",
        counts(HOT, (400, 400)),
        {},
        rebalance(A, "count", HOT, threshold=0.05),
    ),
    (
        "heterogeneous speeds (TAG): count-0 is 4x faster, so it takes 4/5 of the load",
        counts(EVEN, (400, 100)),
        {},
        keyed({"count-0": range(13), "count-1": range(13, 16)}),
    ),
    (
        "same, time_aware off: equal record counts are balanced",
        counts(EVEN, (400, 100)),
        {"time_aware": False},
        None,
    ),
    (
        "speeds measured on idle tasks (busy 0.02 and 0.08 < min_busy) are not trusted",
        counts(EVEN, (4000, 1000)),
        {},
        None,
    ),
    (
        "under the threshold (hysteresis): 0.14 < 0.2",
        counts({g: 11.5 if g < 8 else 8.65 for g in range(16)}, (400, 400)),
        {},
        None,
    ),
    ("too little traffic to measure", counts({0: 0.5}, (400, 400)), {"min_rate": 1.0}, None),
    ("other operators selected", counts(HOT, (400, 400)), {"operators": ["split"]}, None),
    (
        "max_moves caps one plan: the hottest-gap group first",
        counts(HOT, (400, 400)),
        {"max_moves": 1},
        keyed({"count-0": range(1, 8), "count-1": [0, *range(8, 16)]}),
    ),
    (
        "fluid mode and batches are carried",
        counts(HOT, (400, 400)),
        {"mode": "fluid", "batch_size": 2},
        Plan(A.version, rebalance(A, "count", HOT, threshold=0.05).ops, "fluid", 2),
    ),
]


@pytest.mark.parametrize(("name", "tasks", "config", "expected"), CASES, ids=[c[0] for c in CASES])
def test_load_balancer_table(name: str, tasks: list, config: dict, expected: Plan | None) -> None:
    plan = LoadBalancer(config).decide(view_of(A, window(tasks)))
    assert plan == expected
    if plan is not None:
        apply_plan(A, plan)


def test_rebalance_lowers_imbalance_with_few_moves() -> None:
    plan = LoadBalancer().decide(view_of(A, window(counts(HOT, (400, 400)))))
    assert plan is not None
    b = apply_plan(A, plan)
    loads = [sum(HOT[g] for g in gs) for gs in owners(b, "count").values()]
    assert sorted(loads) == [140.0, 140.0] and imbalance([200, 80]) > 0.2
    assert len(diff(A, b).operator("count").key_group_moves) == 3  # a 40, then two 10s
    # The next period, measured on the new ownership, changes nothing.
    after = [
        task(t, groups={g: HOT[g] for g in gs}, busy=sum(HOT[g] for g in gs) / 400)
        for t, gs in owners(b, "count").items()
    ]
    assert LoadBalancer().decide(view_of(b, window(after))) is None


def test_heterogeneous_result_is_proportional_to_speed() -> None:
    plan = LoadBalancer().decide(view_of(A, window(counts(EVEN, (400, 100)))))
    assert plan is not None
    b = apply_plan(A, plan)
    load = {t: 10.0 * len(gs) for t, gs in owners(b, "count").items()}
    busy = [load["count-0"] / 400, load["count-1"] / 100]  # the busy time each now needs
    assert imbalance(busy) <= 0.05
    assert len(diff(A, b).operator("count").key_group_moves) == 5  # the fewest: 8 - 3


def test_stateless_weights_follow_speed() -> None:
    a = rebalanced()  # lines -rebalance-> split (3 tasks, weight 1 each)
    speeds = {"split-0": 300.0, "split-1": 100.0, "split-2": 100.0}
    tasks = [task(t, in_per_s=50.0, busy=50.0 / s) for t, s in speeds.items()]
    plan = LoadBalancer().decide(view_of(a, window(tasks)))
    costs = {t: 1 / s for t, s in speeds.items()}
    assert plan == rebalance(a, "split", costs, threshold=0.2)
    weights = {t.id: t.workload.weight for t in apply_plan(a, plan).operator("split").tasks}
    assert weights == pytest.approx({"split-0": 1.8, "split-1": 0.6, "split-2": 0.6})
    assert LoadBalancer({"stateless": False}).decide(view_of(a, window(tasks))) is None


def test_proportional_balance_directly() -> None:
    current = {"a": (0, 1, 2, 3), "b": (4, 5), "c": ()}
    loads = {g: 1.0 for g in range(6)}
    result = proportional_balance(current, loads, {"a": 1.0, "b": 1.0, "c": 2.0})
    assert sorted(g for gs in result.values() for g in gs) == list(range(6))
    sizes = {t: len(gs) for t, gs in result.items()}
    assert sizes["c"] == 3 and sorted([sizes["a"], sizes["b"]]) == [1, 2]  # c is twice as fast
    assert proportional_balance(current, {}, {"a": 1.0, "b": 1.0, "c": 1.0}) == current


def test_load_balancer_config_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"config.target: must be between 0 and threshold"):
        LoadBalancer({"threshold": 0.1, "target": 0.2})
    with pytest.raises(ConfigError, match="batch_size: must be >= 1 and needs mode 'fluid'"):
        LoadBalancer({"batch_size": 4})
