"""The load balancer's hot keys (TAG's key splitting) on constructed views: a key too hot
for its task is split over as many tasks as it needs (its owner and the least loaded
others), widened when it needs more, merged back once it cooled down, and left alone
where splitting is not possible or not needed."""

from __future__ import annotations

from typing import Any

import pytest
from controllers_support import JOB, task, view_of, window, wordcount
from test_abstraction import deploy

from controllers import ConfigError, LoadBalancer, SplitKey
from controlplane.abstraction import Abstraction, apply_plan, split_key
from runtime.dataflow import load_job
from runtime.keygroups import key_group

MP = 16
SPEED = 1000.0  # records per busy second of every count task
HOT = "w7"


def aggregated(parallelism: int = 3) -> Abstraction:
    """sentences -> split -> count (combinable, 16 key groups) -> count.merge -> sink, task i
    of each on worker i (3 workers)."""
    params = {"parallelism": parallelism, "max_parallelism": MP, "aggregate": True}
    graph = load_job("examples.wordcount:build", params)
    return deploy(graph, n_workers=parallelism).replace(job_id=JOB)


def metrics(a: Abstraction, hot: dict[str, float], loads: dict[str, float]) -> dict[str, Any]:
    """count tasks with records/s ``loads`` (default 300) spread over their key groups,
    each busy at load / SPEED, reporting the hot keys ``hot`` ({task: rate of HOT})."""
    op = a.operator("count")
    tasks = []
    for t in op.tasks:
        rate = loads.get(t.id, 300.0)
        groups = t.workload.key_groups or ()
        tasks.append(
            task(
                t.id,
                groups={g: rate / len(groups) for g in groups},
                busy=rate / SPEED,
                worker=t.worker,
            )
        )
    doc = window(tasks)
    for entry in doc["tasks"]:
        rate = hot.get(entry["task"])
        if rate:
            entry["hot_keys"] = [
                {
                    "key": HOT,
                    "group": key_group(HOT, MP),
                    "per_s": rate,
                    "error_per_s": 0.0,
                    "share": rate / entry["in_per_s"],
                }
            ]
    return doc


def decide(a: Abstraction, hot: dict[str, float], loads: dict[str, float] | None = None, **cfg):
    return LoadBalancer({"threshold": 10.0, "target": 1.0, **cfg}).decide(
        view_of(a, metrics(a, hot, loads or {}))
    )


def test_a_key_needing_more_than_half_a_task_is_split_over_its_owner_and_the_idlest() -> None:
    a = aggregated()
    owner = a.operator("count").owner_of_key(HOT)
    others = [t for t in a.operator("count").task_ids if t != owner]
    idle, busy = others[0], others[1]
    plan = decide(a, {owner: 800.0}, {owner: 900.0, idle: 100.0, busy: 500.0})
    assert plan is not None and plan.ops == (SplitKey("count", HOT, (owner, idle)),)
    # 1,400/s needs three parts of at most half a task each.
    plan = decide(a, {owner: 1400.0}, {owner: 950.0})
    assert plan is not None and len(plan.ops[0].tasks) == 3  # type: ignore[union-attr]


def test_a_split_key_that_needs_more_ways_is_split_wider_and_merged_back_when_cool() -> None:
    a = aggregated()
    owner = a.operator("count").owner_of_key(HOT)
    split = apply_plan(a, split_key(a, "count", HOT, 2))
    parts = split.operator("count").splits()[HOT]
    holders = [split.operator("count").owner_of_groups()[g] for g in parts]
    # Its two parts at 700/s each: 1,400/s needs 3 ways.
    plan = decide(split, dict.fromkeys(holders, 700.0))
    assert plan is not None and len(plan.ops[0].tasks) == 3  # type: ignore[union-attr]
    # Still at 2 x 300/s: enough ways, nothing to do (and no rebalance: loads are even).
    assert decide(split, dict.fromkeys(holders, 300.0)) is None
    # Cooled down to 2 x 50/s, under merge_below (0.2) of a task: merged back.
    plan = decide(split, dict.fromkeys(holders, 50.0))
    assert plan is not None and plan.ops == (SplitKey("count", HOT, ()),)
    assert owner in holders


@pytest.mark.parametrize(
    ("why", "config"),
    [("turned off", {"split_hot_keys": False}), ("another operator", {"operators": ["split"]})],
)
def test_hot_keys_are_not_split_when_told_not_to(why: str, config: dict[str, Any]) -> None:
    a = aggregated()
    owner = a.operator("count").owner_of_key(HOT)
    assert decide(a, {owner: 900.0}, **config) is None, why


def test_a_key_of_an_operator_that_cannot_split_is_left_to_rebalancing() -> None:
    plain = wordcount(parallelism=3, max_parallelism=MP)
    hot = {"count-0": 900.0}
    doc = metrics_plain(plain, hot)
    assert LoadBalancer({"threshold": 10.0, "target": 1.0}).decide(view_of(plain, doc)) is None


def metrics_plain(a: Abstraction, hot: dict[str, float]) -> dict[str, Any]:
    doc = window(
        task(t.id, groups={g: 20.0 for g in t.workload.key_groups or ()}, busy=0.3)
        for t in a.operator("count").tasks
    )
    for entry in doc["tasks"]:
        if entry["task"] in hot:
            entry["hot_keys"] = [
                {"key": HOT, "group": 0, "per_s": hot[entry["task"]], "error_per_s": 0, "share": 1}
            ]
    return doc


def test_split_thresholds_are_checked() -> None:
    with pytest.raises(ConfigError, match="merge_below"):
        LoadBalancer({"split_above": 0.3, "merge_below": 0.3})
    with pytest.raises(ConfigError, match="split_above"):
        LoadBalancer({"split_above": 0.0})
