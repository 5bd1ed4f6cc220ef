"""The ``splitKey`` operation: which operators and tasks it applies to, the key groups its
parts get, the JSON forms (plan, abstraction, diff) and the layout it makes."""

from __future__ import annotations

import pytest
from test_abstraction import deploy, plan, refused, wordcount_abs

from controlplane.abstraction import (
    Abstraction,
    AssignResource,
    InvalidPlan,
    Plan,
    SchemaError,
    SplitKey,
    UnknownTask,
    apply_plan,
    check_abstraction,
    diff,
    fluid_steps,
    rebalance,
    scale,
    split_key,
)
from controlplane.abstraction.ops import op_from_dict
from controlplane.coordinator.layouts import layout_of
from runtime.dataflow import load_job
from runtime.keygroups import key_group
from runtime.layout import Layout, affected_tasks

MP = 16


def aggregated(parallelism: int = 3) -> Abstraction:
    params = {"parallelism": parallelism, "max_parallelism": MP, "aggregate": True}
    return deploy(load_job("examples.wordcount:build", params))


def owner(a: Abstraction, key: object) -> str:
    return a.owner_of("count")[key_group(key, MP)]


def test_a_split_puts_a_part_in_a_group_of_each_task_the_keys_own_group_first() -> None:
    a = aggregated()
    home = key_group("the", MP)
    others = [t for t in a.operator("count").task_ids if t != owner(a, "the")]
    b = apply_plan(a, plan(a, SplitKey("count", "the", (*others, owner(a, "the")))))
    check_abstraction(b)
    groups = b.operator("count").splits()["the"]
    assert groups[0] == home and len(groups) == 3
    for g, t in zip(groups[1:], others, strict=True):
        assert g == min(b.task(t).workload.key_groups or ())
    assert b.operator("count.merge").split_keys == ()
    # ... and merged back: no split left.
    c = apply_plan(b, split_key(b, "count", "the", []))
    assert c.operator("count").split_keys == ()


def test_a_split_by_number_of_ways_starts_at_the_keys_owner() -> None:
    a = aggregated()
    p = split_key(a, "count", "the", 2)
    assert p.ops[0].tasks[0] == owner(a, "the")  # type: ignore[union-attr]
    assert split_key(a, "count", "the", 1).ops[0].tasks == ()  # type: ignore[union-attr]


@pytest.mark.parametrize("key", ["the", 7, 2.5, True, None, ("eu", 7)])
def test_plans_and_abstractions_with_split_keys_round_trip_through_json(key: object) -> None:
    a = aggregated()
    p = split_key(a, "count", key, 3)
    assert Plan.from_dict(p.to_dict()) == p
    b = apply_plan(a, p)
    assert Abstraction.from_dict(b.to_dict()) == b
    assert b.operator("count").splits()[key][0] == key_group(key, MP)


def test_only_the_partial_side_of_a_combinable_aggregation_splits_keys() -> None:
    a = aggregated()
    refused(a, split_key(a, "count.merge", "the", 2), InvalidPlan, "not a combinable")
    plain = wordcount_abs(3)
    refused(plain, split_key(plain, "count", "the", 2), InvalidPlan, "aggregate(...)")


def test_bad_splits_are_refused_naming_what_to_fix() -> None:
    a = aggregated()
    with pytest.raises(InvalidPlan, match="two tasks or more"):
        SplitKey("count", "the", ("count-0",))
    with pytest.raises(InvalidPlan, match="listed twice"):
        SplitKey("count", "the", ("count-0", "count-0"))
    with pytest.raises(InvalidPlan, match="a key is a string"):
        SplitKey("count", {"no": "dicts"}, ("count-0", "count-1"))
    with pytest.raises(SchemaError, match=r"ops\[0\].key"):
        Plan.from_dict(
            {
                "base_version": 1,
                "ops": [{"op": "splitKey", "operator": "count", "key": {}, "tasks": []}],
            }
        )
    refused(a, plan(a, SplitKey("count", "the", ())), InvalidPlan, "'the'", "is not split")
    refused(a, plan(a, SplitKey("count", "the", ("count-0", "count-9"))), UnknownTask, "count-9")
    with pytest.raises(InvalidPlan, match="has 3 tasks"):
        split_key(a, "count", "the", 4)


def test_a_task_without_key_groups_cannot_hold_a_part() -> None:
    a = aggregated(2)
    refused(
        a,
        plan(
            a,
            AssignResource("count", "count-2", "w0"),
            SplitKey("count", "the", ("count-0", "count-2")),
        ),
        InvalidPlan,
        "count-2",
        "owns no key groups",
    )


def test_the_logic_of_a_combinable_aggregation_is_not_swapped() -> None:
    from controlplane.abstraction import update_logic

    a = aggregated()
    refused(a, update_logic(a, "count", "examples.wordcount:count_word"), InvalidPlan, "resubmit")


def test_a_split_survives_key_group_moves_and_rescales() -> None:
    a = apply_plan(aggregated(), split_key(aggregated(), "count", "the", 3))
    b = apply_plan(a, scale(a, "count", 2))
    check_abstraction(b)
    assert b.operator("count").splits() == a.operator("count").splits()


def test_the_diff_and_the_layout_show_a_split_and_whom_it_affects() -> None:
    a = aggregated()
    b = apply_plan(a, split_key(a, "count", "the", 2))
    d = diff(a, b)
    op = d.operator("count")
    groups = b.operator("count").splits()["the"]
    assert op.split_changes == (("the", (), groups),)
    assert op.to_dict()["split_changes"] == [{"key": "the", "before": [], "after": list(groups)}]
    count_tasks = set(b.operator("count").task_ids)
    split_tasks = set(b.operator("split").task_ids)
    assert count_tasks | split_tasks <= d.affected
    assert not {t for t in d.affected if t.startswith(("count.merge", "sink"))}
    graph = load_job(
        "examples.wordcount:build", {"parallelism": 3, "max_parallelism": MP, "aggregate": True}
    )
    old = Layout.initial(graph, [w.id for w in a.workers])
    new = layout_of(b, graph, a, old)
    assert new.splits == {"count": {"the": groups}}
    assert Layout.from_wire(new.to_wire()) == new
    assert affected_tasks(graph, old, new) == count_tasks | split_tasks


def test_a_fluid_plan_splits_in_its_first_step() -> None:
    a = aggregated()
    p = split_key(a, "count", "the", 2)
    loads = {g: float(g) for g in range(MP)}
    both = Plan(a.version, (*p.ops, *rebalance(a, "count", loads).ops), "fluid", 2)
    steps = fluid_steps(a, both)
    assert any(isinstance(op, SplitKey) for op in steps[0])
    assert op_from_dict(p.ops[0].to_dict()) == p.ops[0]
