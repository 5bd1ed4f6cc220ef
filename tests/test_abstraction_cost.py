"""The state a change ships between workers (controlplane.abstraction.cost): examples,
and invariants over random plans (Hypothesis)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from test_abstraction_fluid import random_fluid_plan
from test_abstraction_plans import SETTINGS, deployments, graph

from controlplane.abstraction import (
    Abstraction,
    Plan,
    Worker,
    apply_plan,
    bytes_shipped,
    fluid_steps,
    from_graph,
    key_group_bytes,
    largest_step,
    migrate,
    rebalance,
    scale,
)
from runtime.layout import Layout

MB = 1_000_000


def wordcount(workers: int = 2) -> Abstraction:
    g = graph("wordcount", 2, 128)
    ws = [Worker(f"w{i}", "h", 1.0, 1024, "local") for i in range(workers)]
    return from_graph("job", g, Layout.initial(g, [w.id for w in ws]), ws)


def test_each_task_s_state_is_spread_over_its_key_groups() -> None:
    a = wordcount()
    sizes = key_group_bytes(a, {"count-0": 64 * MB, "count-1": 32 * MB})
    assert set(sizes) == {"count"}  # the keyed operators only
    assert len(sizes["count"]) == 128
    assert sum(sizes["count"].values()) == 96 * MB
    assert {sizes["count"][g] for g in a.task("count-0").workload.key_groups} == {MB}
    assert key_group_bytes(a, {"count-0": 64 * MB})["count"].keys() == set(
        a.task("count-0").workload.key_groups
    )  # a task without a size: its groups have none
    # A task's reported share of a key group wins over its mean.
    first = a.task("count-0").workload.key_groups[0]
    shared = key_group_bytes(a, {"count-0": 64 * MB}, {"count-0": {first: 5 * MB}})
    assert shared["count"][first] == 5 * MB
    assert shared["count"][first + 1] == MB


def test_a_migration_ships_its_task_s_state_and_a_move_on_one_worker_nothing() -> None:
    a = wordcount()
    sizes = key_group_bytes(a, {"count-0": 64 * MB, "count-1": 32 * MB})
    moved = apply_plan(a, migrate(a, "count-0", "w1"))
    assert bytes_shipped(a, moved, sizes) == 64 * MB
    # Both count tasks on w1 now: rebalancing between them ships nothing.
    evened = apply_plan(moved, rebalance(moved, "count", {g: float(g) for g in range(128)}))
    assert bytes_shipped(moved, evened, sizes) == 0
    assert bytes_shipped(a, moved, key_group_bytes(a, {"count-1": 1.0})) is None  # unmeasured
    assert largest_step(a, migrate(a, "count-0", "w1"), sizes) == 64 * MB


def test_a_fluid_plan_s_largest_step_is_a_batch_of_key_groups() -> None:
    a = wordcount()
    sizes = key_group_bytes(a, {"count-0": 64 * MB, "count-1": 64 * MB})
    local = scale(a, "count", 4, workers=["w0", "w1"])  # count-2 on w0, count-3 on w1
    assert bytes_shipped(a, apply_plan(a, local), sizes) == 0  # each takes from its worker's
    out = scale(a, "count", 4, workers=["w1", "w0"])  # count-2 on w1, count-3 on w0
    whole = bytes_shipped(a, apply_plan(a, out), sizes)
    assert whole == 64 * MB  # the 32 key groups each old task gives cross workers
    assert largest_step(a, out, sizes) == whole  # pause mode: one step
    # Fluid, 8 key groups a step: a step ships 8 from each old task.
    assert largest_step(a, replace(out, mode="fluid", batch_size=8), sizes) == 16 * MB
    # A fluid migration through a stand-in ships each key group once, a batch at a time.
    through = replace(migrate(a, "count-0", "w1"), mode="fluid", batch_size=16)
    assert largest_step(a, through, sizes) == 16 * MB


@SETTINGS
@given(deployments(), st.data())
def test_fluid_steps_ship_the_whole_plan_s_state_between_them(
    a: Abstraction, data: st.DataObject
) -> None:
    """Every key group has a size: the steps of a fluid plan ship what the plan ships in
    one (a stand-in's hand-back stays on its worker), none of them more."""
    drawn = random_fluid_plan(data, a)
    if drawn is None:
        return
    plan, whole = drawn
    weight = data.draw(st.floats(1.0, 1e9))
    task_bytes = {
        t.id: weight * (i + 1) for i, t in enumerate(t for op in a.operators for t in op.tasks)
    }
    sizes = key_group_bytes(a, task_bytes)
    total = bytes_shipped(a, whole, sizes)
    assert total is not None and total >= 0
    shipped, current = [], a
    for ops in fluid_steps(a, plan):
        after = apply_plan(current, Plan(current.version, ops))
        shipped.append(bytes_shipped(current, after, sizes))
        current = after
    assert None not in shipped
    assert abs(sum(shipped) - total) <= 1e-6 * max(total, 1.0)
    assert largest_step(a, plan, sizes) == max(shipped, default=0.0)
