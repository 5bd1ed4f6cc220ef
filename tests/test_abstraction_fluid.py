"""Fluid mode's split of a plan into steps (hypothesis): applied in order, the steps are
each valid, move at most ``batch_size`` key groups each, touch only what the plan touches,
and end exactly where the plan ends (one version per step)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st
from test_abstraction_plans import SETTINGS, deployments, random_step

from controlplane.abstraction import (
    Abstraction,
    Plan,
    WorkerOverCapacity,
    apply_plan,
    diff,
    fluid_steps,
    scale,
)


def without_version(a: Abstraction) -> dict[str, Any]:
    d = a.to_dict()
    d["job"] = {k: v for k, v in d["job"].items() if k != "version"}
    return d


def run_steps(a: Abstraction, steps: list) -> list[Abstraction]:
    out = [a]
    for ops in steps:
        out.append(apply_plan(out[-1], Plan(out[-1].version, ops)))
    return out


@SETTINGS
@given(deployments(), st.data())
def test_steps_reach_the_plans_result_in_small_valid_steps(
    a: Abstraction, data: st.DataObject
) -> None:
    try:
        _, plan, _ = random_step(data.draw, a)
    except WorkerOverCapacity:
        return
    if not plan:
        return
    batch = data.draw(st.none() | st.integers(1, 3))
    plan = replace(plan, mode="fluid", batch_size=batch)
    try:
        whole = apply_plan(a, plan)
    except WorkerOverCapacity:
        return
    steps = fluid_steps(a, plan)
    event(f"steps: {min(len(steps), 4)}{'+' if len(steps) > 4 else ''}")
    chain = run_steps(a, steps)
    assert without_version(chain[-1]) == without_version(whole)
    assert chain[-1].version == a.version + len(steps)
    planned = diff(a, whole)
    for before, after in itertools.pairwise(chain):
        d = diff(before, after)
        moves = sum(len(o.key_group_moves) for o in d.operators)
        if batch is not None:
            assert moves <= batch
        assert d.affected <= planned.affected


def test_a_big_move_becomes_many_small_steps() -> None:
    from test_abstraction_plans import graph

    from controlplane.abstraction import Worker, from_graph
    from runtime.layout import Layout

    g = graph("wordcount", 2, 128)
    ws = [Worker(f"w{i}", "h", 1.0, 1024, "local") for i in range(2)]
    a = from_graph("job", g, Layout.initial(g, ["w0", "w1"]), ws)
    plan = replace(scale(a, "count", 4), mode="fluid", batch_size=8)
    steps = fluid_steps(a, plan)
    chain = run_steps(a, steps)
    # setup (two new tasks), then 64 moved key groups 8 at a time
    assert len(steps) == 1 + 64 // 8
    assert all(not chain[1].task(f"count-{i}").workload.key_groups for i in (2, 3))
    sizes = [len(chain[-1].task(f"count-{i}").workload.key_groups) for i in range(4)]
    assert sizes == [32, 32, 32, 32]
