"""The plan helpers on small hand-checked cases: scale, rebalance, migrate, update_logic."""

from __future__ import annotations

import pytest
from test_abstraction import deploy, rebalanced_graph, wordcount_abs

from controlplane.abstraction import (
    NEW_WORKER,
    AssignLogic,
    AssignResource,
    InvalidPlan,
    KeyGroupConflict,
    UnknownTask,
    UnknownWorker,
    apply_plan,
    diff,
    migrate,
    rebalance,
    scale,
    update_logic,
)


def test_scale_out_and_in_wordcount() -> None:
    a = wordcount_abs(parallelism=2, max_parallelism=16, n_workers=3)
    p = scale(a, "count", 3)
    assert [type(op).__name__ for op in p.ops] == [
        "AssignResource",
        "AssignResource",
        "AssignWorkload",
        "AssignWorkload",
    ]
    b = apply_plan(a, p)
    assert b.task("count-2").worker == b.task("sink-2").worker == "w2"  # the idle worker
    assert [len(t.workload.key_groups or ()) for t in b.operator("count").tasks] == [6, 5, 5]
    assert len(diff(a, b).operator("count").key_group_moves) == 5
    c = apply_plan(b, scale(b, "sink", 1))  # scales count too: forward-connected
    assert c.operator("count").task_ids == ("count-0",) and c.operator("sink").task_ids == (
        "sink-0",
    )
    assert c.task("count-0").workload.key_groups == tuple(range(16))
    with pytest.raises(InvalidPlan, match="forward-connected to source 'sentences'"):
        scale(a, "split", 3)
    with pytest.raises(InvalidPlan, match="is a source"):
        scale(a, "sentences", 3)
    with pytest.raises(InvalidPlan, match="has 16 key groups: it cannot have 17 tasks"):
        scale(a, "count", 17)
    assert not scale(a, "count", 2)


def test_scale_stateless_and_rebalance_weights() -> None:
    a = deploy(rebalanced_graph(), n_workers=2)
    b = apply_plan(a, scale(a, "split", 5, workers=["w1"]))
    assert [t.workload.weight for t in b.operator("split").tasks] == [1.0] * 5
    assert {t.worker for t in b.operator("split").tasks[3:]} == {"w1"}
    c = apply_plan(b, rebalance(b, "split", {"split-0": 2.0, "split-1": 1.0}))
    w = {t.id: t.workload.weight for t in c.operator("split").tasks}
    assert w["split-1"] == pytest.approx(2 * w["split-0"], rel=1e-5) and sum(
        w.values()
    ) == pytest.approx(5)
    assert not rebalance(c, "split", {"split-0": 2.0, "split-1": 1.0})
    assert not rebalance(c, "split", None, threshold=10.0)
    d = apply_plan(c, rebalance(c, "split"))
    assert [t.workload.weight for t in d.operator("split").tasks] == [1.0] * 5
    e = apply_plan(d, scale(d, "split", 2))
    assert e.operator("split").task_ids == ("split-0", "split-1")
    with pytest.raises(InvalidPlan, match="only over forward or broadcast edges"):
        rebalance(a, "out")
    with pytest.raises(UnknownTask, match="no task 'count-0'"):
        rebalance(a, "split", {"count-0": 1.0})


def test_rebalance_keyed() -> None:
    a = wordcount_abs(parallelism=2, max_parallelism=8)  # count-0: 0-3, count-1: 4-7
    hot = {0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0, 4: 1.0}
    b = apply_plan(a, rebalance(a, "count", hot))
    loads = sorted(
        sum(hot.get(g, 0) for g in t.workload.key_groups or ()) for t in b.operator("count").tasks
    )
    assert loads == [20.0, 21.0]
    assert len(diff(a, b).operator("count").key_group_moves) == 2
    assert not rebalance(a, "count", hot, threshold=1.0)
    assert not rebalance(a, "count")  # already even by count
    with pytest.raises(KeyGroupConflict, match=r"key group 8, outside 0\.\.7"):
        rebalance(a, "count", {8: 1.0})
    with pytest.raises(InvalidPlan, match="load of 1 must be"):
        rebalance(a, "count", {1: -1.0})


def test_migrate_and_update_logic_helpers() -> None:
    a = wordcount_abs(n_workers=3)
    assert not migrate(a, "count-0", "w0")
    b = apply_plan(a, migrate(a, "count-0", NEW_WORKER, mode="fluid", batch_size=4))
    assert b.task("count-0").worker == "new-1"
    with pytest.raises(UnknownWorker):
        migrate(a, "count-0", "w9")
    with pytest.raises(UnknownTask):
        migrate(a, "count-9", "w1")
    with pytest.raises(UnknownTask, match="no task 'count-4'"):
        update_logic(a, "count", "examples.wordcount:count_word", ["count-4"])
    p = update_logic(a, "split", "examples.wordcount:split_words")
    assert p.ops == (AssignLogic("split", "all", "examples.wordcount:split_words"),)
    # With its forward partners: count-0 -forward-> sink-0 move together, to one new worker.
    chained = apply_plan(a, migrate(a, "count-0", NEW_WORKER, with_forward=True))
    assert chained.task("count-0").worker == chained.task("sink-0").worker == "new-1"
    assert len(chained.workers) == len(a.workers) + 1
    assert migrate(a, "count-1", "w2", with_forward=True).ops == (
        AssignResource("count", "count-1", "w2"),
        AssignResource("sink", "sink-1", "w2"),
    )
    partner_there = apply_plan(a, migrate(a, "sink-1", "w2"))
    assert migrate(partner_there, "count-1", "w2", with_forward=True).ops == (
        AssignResource("count", "count-1", "w2"),
    )
    both_there = apply_plan(partner_there, migrate(partner_there, "count-1", "w2"))
    assert not migrate(both_there, "count-1", "w2", with_forward=True)
    src = migrate(a, "sentences-1", "w2")
    assert apply_plan(a, src).task("sentences-1").worker == "w2"  # sources may move
