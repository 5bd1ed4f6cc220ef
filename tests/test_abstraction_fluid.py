"""Fluid mode's split of a plan into steps (hypothesis): applied in order, the steps are
each valid, move at most ``batch_size`` key groups out of and into each task, touch only
what the plan touches, and end exactly where the plan ends (one version per step)."""

from __future__ import annotations

import itertools
from collections import Counter
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


def crosses_no_worker(before: Abstraction, after: Abstraction) -> bool:
    """Every key group that changes owner stays on its worker (a stand-in's hand-back)."""
    return all(
        before.task(src).worker == after.task(dst).worker
        for o in diff(before, after).operators
        for _, src, dst in o.key_group_moves
    )


def busiest(before: Abstraction, after: Abstraction) -> int:
    """The most key groups one task gives, or gains, from ``before`` to ``after``."""
    ends = Counter(
        end
        for o in diff(before, after).operators
        for _, src, dst in o.key_group_moves
        for end in ((src, "gives"), (dst, "gains"))
    )
    return max(ends.values(), default=0)


def moved_groups(before: Abstraction, after: Abstraction) -> set[tuple[str, int]]:
    return {(o.operator, g) for o in diff(before, after).operators for g, _, _ in o.key_group_moves}


def only_moves(before: Abstraction, after: Abstraction) -> bool:
    """Whether only key groups change owner (a step the coordinator runs as a stage)."""
    d = diff(before, after)
    return all(
        not (o.weight_changes or o.new_tasks or o.removed_tasks or o.moved_tasks)
        and not o.logic_changes
        for o in d.operators
    )


def run_steps(a: Abstraction, steps: list) -> list[Abstraction]:
    out = [a]
    for ops in steps:
        out.append(apply_plan(out[-1], Plan(out[-1].version, ops)))
    return out


def random_fluid_plan(data: st.DataObject, a: Abstraction) -> tuple[Plan, Abstraction] | None:
    """A random plan on ``a`` in fluid mode (1 to 3 key groups a step, or one step) and its
    result; None when the draw makes no valid plan."""
    try:
        _, plan, _ = random_step(data.draw, a)
    except WorkerOverCapacity:
        return None
    if not plan:
        return None
    plan = replace(plan, mode="fluid", batch_size=data.draw(st.none() | st.integers(1, 3)))
    try:
        return plan, apply_plan(a, plan)
    except WorkerOverCapacity:
        return None


@SETTINGS
@given(deployments(), st.data())
def test_steps_reach_the_plans_result_in_small_valid_steps(
    a: Abstraction, data: st.DataObject
) -> None:
    drawn = random_fluid_plan(data, a)
    if drawn is None:
        return
    plan, whole = drawn
    batch = plan.batch_size
    steps = fluid_steps(a, plan)
    event(f"steps: {min(len(steps), 4)}{'+' if len(steps) > 4 else ''}")
    chain = run_steps(a, steps)
    assert without_version(chain[-1]) == without_version(whole)
    assert chain[-1].version == a.version + len(steps)
    planned = diff(a, whole)
    ids = {t.id for op in a.operators for t in op.tasks} | {
        t.id for op in whole.operators for t in op.tasks
    }
    stand_ins = {t.id for b in chain for op in b.operators for t in op.tasks} - ids
    for before, after in itertools.pairwise(chain):
        d = diff(before, after)
        if batch is not None:
            assert busiest(before, after) <= batch or crosses_no_worker(before, after)
        assert d.affected <= planned.affected | stand_ins
    # Consecutive batches move different key groups, so the coordinator can run them as
    # stages under way at once (runtime.layout.stages_can_overlap).
    moves = [moved_groups(b, c) for b, c in itertools.pairwise(chain)]
    for (b, c), (m1, m2) in zip(
        itertools.pairwise(itertools.pairwise(chain)), itertools.pairwise(moves), strict=True
    ):
        if only_moves(*b) and only_moves(*c):
            assert not m1 & m2


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
    # setup (two new tasks), then 64 moved key groups: each old task gives 32 (16 to each
    # new one), 8 at a time, both at once; a new task gains at most 8 a step
    assert len(steps) == 1 + 32 // 8
    assert all(busiest(b, c) == 8 for b, c in itertools.pairwise(chain[1:]))
    assert all(not chain[1].task(f"count-{i}").workload.key_groups for i in (2, 3))
    sizes = [len(chain[-1].task(f"count-{i}").workload.key_groups) for i in range(4)]
    assert sizes == [32, 32, 32, 32]


def test_a_keyed_task_migrates_through_a_stand_in() -> None:
    from test_abstraction_plans import graph

    from controlplane.abstraction import Worker, from_graph, migrate
    from runtime.layout import Layout

    g = graph("wordcount", 2, 128)
    ws = [Worker(f"w{i}", "h", 1.0, 1024, "local") for i in range(2)]
    a = from_graph("job", g, Layout.initial(g, ["w0", "w1"]), ws)
    assert a.task("count-0").worker == "w0"
    plan = replace(migrate(a, "count-0", "w1"), mode="fluid", batch_size=8)
    chain = run_steps(a, fluid_steps(a, plan))
    # stand-ins count-2 and sink-2 on w1; 64 groups to count-2, 8 at a time; count-0 moves
    # empty, takes its groups back on w1 and the stand-ins go, in one step.
    assert len(chain) - 1 == 1 + 64 // 8 + 1
    assert chain[1].task("count-2").worker == chain[1].task("sink-2").worker == "w1"
    emptied = chain[1 + 64 // 8]
    assert not emptied.task("count-0").workload.key_groups
    assert emptied.task("count-0").worker == "w0"
    for before, after in itertools.pairwise(chain):
        moves = sum(len(o.key_group_moves) for o in diff(before, after).operators)
        assert moves <= 8 or crosses_no_worker(before, after)
    assert without_version(chain[-1]) == without_version(
        apply_plan(a, replace(plan, mode="pause", batch_size=None))
    )
