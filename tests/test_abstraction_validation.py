"""Validation of plans: every PlanError, with a message naming the culprit, and the
abstraction left unchanged by a refused plan."""

from __future__ import annotations

import pickle

import pytest
from test_abstraction import deploy, plan, rebalanced_graph, refused, wordcount_abs

from controlplane.abstraction import (
    NEW_WORKER,
    Abstraction,
    AbstractionError,
    AssignLogic,
    AssignResource,
    AssignWorkload,
    BadLogic,
    InvalidPlan,
    KeyGroupConflict,
    Logic,
    NoChange,
    Plan,
    SchemaError,
    StaleVersion,
    TaskStillOwnsWork,
    UnknownOperator,
    UnknownTask,
    UnknownWorker,
    WorkerOverCapacity,
    apply_plan,
    check_abstraction,
    diff,
    resolve_importable,
    scale,
    update_logic,
)
from examples import wordcount


def test_valid_plan_makes_next_version_and_leaves_base_alone() -> None:
    a = wordcount_abs()
    before = a.to_dict()
    b = apply_plan(a, scale(a, "count", 3))
    assert b.version == a.version + 1 and a.to_dict() == before
    check_abstraction(b)
    assert b.task("count-2").logic == a.task("count-0").logic


def test_stale_version() -> None:
    a = wordcount_abs()
    p = Plan(7, scale(a, "count", 3).ops)
    exc = refused(a, p, StaleVersion, "based on version 7", "at version 1")
    assert (exc.base_version, exc.current_version, exc.op_index) == (7, 1, None)


def test_unknown_operator_task_worker() -> None:
    a = wordcount_abs()
    exc = refused(
        a,
        plan(a, AssignResource("counter", "counter-0", "w0")),
        UnknownOperator,
        "operation 0",
        "'counter'",
    )
    assert exc.op_index == 0
    refused(
        a,
        plan(a, AssignResource("count", "count-5", None)),
        UnknownTask,
        "operator 'count' has no task 'count-5'",
    )
    refused(
        a,
        plan(a, AssignWorkload("count", {"split-0": [1]})),
        UnknownTask,
        "'split-0' belongs to operator 'split', not 'count'",
    )
    refused(
        a,
        plan(a, AssignLogic("count", ("count-3",), "examples.wordcount:count_word")),
        UnknownTask,
        "count-3",
    )
    exc = refused(
        a,
        plan(a, AssignResource("count", "count-0", "w1"), AssignResource("count", "count-1", "w7")),
        UnknownWorker,
        "operation 1 (assignResource 'count-1' to worker 'w7')",
        "no worker 'w7'",
    )
    assert exc.op_index == 1


def test_key_group_conflicts() -> None:
    a = wordcount_abs()  # count-0 owns 0-7, count-1 owns 8-15
    twice = plan(a, AssignWorkload("count", {"count-0": list(range(9))}))
    refused(
        a,
        twice,
        KeyGroupConflict,
        "key group 8 of operator 'count' is owned by both 'count-0' and 'count-1'",
    )
    nobody = plan(a, AssignWorkload("count", {"count-0": [0, 1, 2, 6]}))
    refused(
        a, nobody, KeyGroupConflict, "key group(s) 3-5, 7 of operator 'count' are owned by no task"
    )
    outside = plan(a, AssignWorkload("count", {"count-0": [*range(8), 16]}))
    refused(
        a,
        outside,
        KeyGroupConflict,
        "operation 0",
        "key group 16 given to 'count-0' is outside 0..15",
    )


def test_worker_over_capacity() -> None:
    a = wordcount_abs(n_workers=2, slots=4)  # each worker hosts 4 tasks
    refused(
        a,
        plan(a, AssignResource("count", "count-1", "w0")),
        WorkerOverCapacity,
        "worker 'w0' would host 5 tasks of this job but has 4 slots",
    )
    with pytest.raises(WorkerOverCapacity, match="no worker has room for count-2, sink-2"):
        scale(a, "count", 3)
    b = apply_plan(a, scale(a, "count", 3, workers=[NEW_WORKER]))
    assert b.task("count-2").worker == b.task("sink-2").worker == "new-1"


def test_task_still_owns_work() -> None:
    a = deploy(rebalanced_graph())
    refused(
        a,
        plan(a, AssignResource("count", "count-1", None)),
        TaskStillOwnsWork,
        "task 'count-1' still owns key group(s) 4-7",
        "earlier in the plan",
    )
    refused(
        a,
        plan(a, AssignResource("split", "split-2", None)),
        TaskStillOwnsWork,
        "task 'split-2' still has weight 1",
        "set it to 0",
    )
    ok = plan(a, AssignWorkload("split", {"split-2": 0}), AssignResource("split", "split-2", None))
    assert apply_plan(a, ok).operator("split").task_ids == ("split-0", "split-1")


def test_bad_logic() -> None:
    a = wordcount_abs()
    refused(
        a,
        update_logic(a, "count", "examples.wordcount:nope"),
        BadLogic,
        "'examples.wordcount:nope' for operator 'count' does not resolve",
        "has no 'nope'",
    )
    refused(a, update_logic(a, "count", "nomodule:x"), BadLogic, "cannot import module 'nomodule'")
    refused(a, update_logic(a, "count", "examples.wordcount:__all__"), BadLogic, "is not callable")
    refused(a, update_logic(a, "count", "code:abc:f"), BadLogic, "code:<id>:callable")

    def not_callable(ref: str) -> object:
        return 42

    with pytest.raises(BadLogic, match="resolves to a int, which is not callable"):
        apply_plan(a, update_logic(a, "count", "m:f"), resolve_logic=not_callable)


def test_resolve_importable() -> None:
    assert resolve_importable("examples.wordcount:count_word") is wordcount.count_word
    for ref, fragment in [
        ("examples.wordcount:nope", "nope"),
        ("nomodule:x", "nomodule"),
        ("no-colon", "must look like"),
    ]:
        with pytest.raises(BadLogic, match=fragment):
            resolve_importable(ref)


def test_update_logic_bumps_versions_and_new_tasks_inherit() -> None:
    a = wordcount_abs(parallelism=3)
    b = apply_plan(a, update_logic(a, "count", "examples.wordcount:count_word", ["count-1"]))
    assert b.task("count-1").logic == Logic("examples.wordcount:count_word", 2)
    assert b.task("count-0").logic.version == 1
    c = apply_plan(b, update_logic(b, "count", "jobs_for_tests:count"))
    assert {t.logic for t in c.operator("count").tasks} == {Logic("jobs_for_tests:count", 3)}
    d = apply_plan(c, scale(c, "count", 4))
    assert d.task("count-3").logic == Logic("jobs_for_tests:count", 3)
    assert diff(a, b).operator("count").logic_changes == (
        (
            "count-1",
            Logic("examples.wordcount:count_word", 1),
            Logic("examples.wordcount:count_word", 2),
        ),
    )


def test_invalid_plans() -> None:
    a = wordcount_abs()
    r = deploy(rebalanced_graph())
    cases = [
        (a, plan(a), "the plan has no operations"),
        (
            r,
            plan(r, AssignWorkload("split", {"split-0": 0, "split-1": 0, "split-2": 0})),
            "every task of operator 'split' has weight 0",
        ),
        (
            a,
            plan(a, AssignWorkload("split", {"split-0": [1]})),
            "operator 'split' is not keyed (flat_map): assign it weights",
        ),
        (
            a,
            plan(a, AssignWorkload("count", {"count-0": 1.0})),
            "operator 'count' is keyed: assign it key groups",
        ),
        (a, plan(a, AssignWorkload("sentences", {"sentences-0": 2.0})), "is a source"),
        (
            a,
            plan(a, AssignResource("sentences", "sentences-2", "w0")),
            "live rescaling of sources is not supported",
        ),
        (
            a,
            plan(a, AssignResource("count", "count-2", "w0")),
            "forward edge 'count' -> 'sink'",
            "scale both together",
        ),
        (
            a,
            plan(a, AssignResource("count", "count_2", "w0")),
            "new task id 'count_2' must be 'count-<index>'",
        ),
        (
            a,
            plan(
                a, AssignResource("count", "count-3", "w0"), AssignResource("sink", "sink-3", "w0")
            ),
            "task indices must be 0..n-1 (missing count-2)",
        ),
        (
            a,
            plan(a, AssignLogic("sink", "all", "examples.wordcount:count_word")),
            "is a sink: its logic is an object",
        ),
        (r, plan(r, AssignWorkload("lines", {"lines-0": 1.0})), "is a source"),
    ]
    for base, p, *fragments in cases:
        refused(base, p, InvalidPlan, *fragments)
    one = deploy(rebalanced_graph())
    one_split = apply_plan(
        one,
        plan(
            one,
            AssignWorkload("split", {"split-1": 0, "split-2": 0}),
            AssignResource("split", "split-1", None),
            AssignResource("split", "split-2", None),
        ),
    )
    refused(
        one_split,
        plan(
            one_split,
            AssignWorkload("split", {"split-0": 0.0}),
            AssignResource("split", "split-0", None),
        ),
        InvalidPlan,
        "the last task of operator 'split'",
    )
    refused(one_split, plan(one_split, AssignResource("split", "split-0", None)), TaskStillOwnsWork)
    lost = Abstraction.from_dict(
        {
            **a.to_dict(),
            "workers": [
                *a.to_dict()["workers"],
                {**a.workers[0].to_dict(), "id": "w9", "status": "lost"},
            ],
        }
    )
    refused(
        lost,
        plan(lost, AssignResource("count", "count-0", "w9")),
        InvalidPlan,
        "worker 'w9' is lost",
    )
    refused(a, plan(a, AssignResource("count", "count-0", "w0")), NoChange, "changes nothing")
    refused(a, plan(a, AssignWorkload("split", {"split-0": 1.0})), NoChange)


def test_new_worker_placeholders() -> None:
    a = wordcount_abs()
    p = plan(
        a,
        AssignResource("count", "count-2", NEW_WORKER),
        AssignResource("sink", "sink-2", "new-1"),
        AssignResource("count", "count-1", NEW_WORKER),
        AssignResource("count", "count-1", "w1"),  # new-2 ends up unused and is dropped
        AssignWorkload(
            "count", {"count-2": [7, 15], "count-0": list(range(7)), "count-1": list(range(8, 15))}
        ),
        AssignWorkload("sink", {"sink-2": 1}),
    )
    b = apply_plan(a, p)
    assert [w.id for w in b.workers] == ["w0", "w1", "new-1"]
    assert b.worker("new-1").placeholder and b.worker("new-1").status == "pending"
    d = diff(a, b)
    assert d.new_workers == ("new-1",) and d.operator("count").new_tasks == ("count-2",)


def test_errors_pickle_with_their_attributes() -> None:
    for exc in (StaleVersion(3, 5), KeyGroupConflict("x", op_index=2), SchemaError("y")):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc) and back.__dict__ == exc.__dict__
    assert isinstance(StaleVersion(1, 2), AbstractionError) and isinstance(
        NoChange("z"), InvalidPlan
    )
