"""The logic updater: the config names the logic, the plan swaps the tasks that differ."""

from __future__ import annotations

import pytest
from controllers_support import view_of, wordcount

from controllers import AssignLogic, ConfigError, LogicUpdater, Outcome, Plan, preview
from controlplane.abstraction import apply_plan

A = wordcount(parallelism=3)
V2 = "examples.wordcount:count_word_v2"
V3 = "examples.wordcount:count_word_v3"
HALF = apply_plan(A, Plan(A.version, (AssignLogic("count", ("count-1",), V2),)))

CASES = [
    # (name, abstraction, config logic, expected ops or None)
    ("new ref for every task", A, {"count": V2}, (AssignLogic("count", "all", V2),)),
    (
        "already there",
        apply_plan(A, Plan(A.version, (AssignLogic("count", "all", V2),))),
        {"count": V2},
        None,
    ),
    (
        "half rolled: only the stale tasks",
        HALF,
        {"count": V2},
        (AssignLogic("count", ("count-0", "count-2"), V2),),
    ),
    (
        "two operators in one plan",
        A,
        {"split": "examples.wordcount:split_words_v2", "count": V3},
        (
            AssignLogic("split", "all", "examples.wordcount:split_words_v2"),
            AssignLogic("count", "all", V3),
        ),
    ),
    ("nothing configured", A, {}, None),
]


@pytest.mark.parametrize(("name", "a", "logic", "ops"), CASES, ids=[c[0] for c in CASES])
def test_logic_updater_table(name: str, a: object, logic: dict, ops: tuple | None) -> None:
    v = view_of(a)  # type: ignore[arg-type]
    c = LogicUpdater({"logic": logic})
    c.on_start(v)
    plan = c.decide(v)
    assert (None if plan is None else plan.ops) == ops
    if plan is not None:
        b = preview(v.abstraction, plan)
        assert all(
            t.logic.ref == logic[op.name]
            for op in b.operators
            if op.name in logic
            for t in op.tasks
        )
        assert c.decide(view_of(b)) is None


def test_unknown_operator_is_reported_at_start() -> None:
    with pytest.raises(ConfigError, match=r"config.logic.rules: job '1' has no operator 'rules'"):
        LogicUpdater({"logic": {"rules": V2}}).on_start(view_of(A))
    with pytest.raises(ConfigError, match=r"config.logic.count: expected a string"):
        LogicUpdater({"logic": {"count": 2}})


def test_gives_up_on_a_ref_that_keeps_failing() -> None:
    c = LogicUpdater({"logic": {"count": "examples.wordcount:no_such_rule"}, "max_attempts": 2})
    v = view_of(A)
    plan = c.decide(v)
    assert plan is not None
    c.on_result(Outcome(1.0, plan, "refused", "operation 0: BadLogic ..."))
    c.on_result(Outcome(2.0, plan, "dry_run"))  # a dry run is not a failure
    assert c.decide(v) == plan
    c.on_result(Outcome(3.0, plan, "failed", "update timed out"))
    assert c.decide(v) is None  # two failures: given up
    ok = LogicUpdater({"logic": {"count": V2}, "max_attempts": 2})
    p2 = ok.decide(v)
    assert p2 is not None
    ok.on_result(Outcome(1.0, p2, "aborted", "sync timed out"))
    ok.on_result(Outcome(2.0, p2, "completed"))  # success clears the count
    ok.on_result(Outcome(3.0, p2, "aborted", "sync timed out"))
    assert ok.decide(v) == p2
