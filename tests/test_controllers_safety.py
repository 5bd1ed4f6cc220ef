"""The safety limits the host enforces on every controller plan: a table of plans and
histories -> verdicts, with the reasons a person reads; the shorter cooldown of a plan
that only scales out."""

from __future__ import annotations

from dataclasses import replace

import pytest
from controllers_support import rebalanced, wordcount
from hypothesis import given
from hypothesis import strategies as st

from controllers import ConfigError, Outcome, Plan, PlanBuilder, SafetyConfig
from controllers.plans import preview
from controllers.safety import check, count_moves, only_scales_out
from controlplane.abstraction import (
    Abstraction,
    AssignWorkload,
    apply_plan,
    diff,
    key_group_bytes,
    migrate,
    rebalance,
    scale,
)

NOW = 10_000.0
A = wordcount(parallelism=2, max_parallelism=16, n_workers=3)  # count-0: 0-7, count-1: 8-15
OUT = scale(A, "count", 4)  # moves 8 key groups (4 + 4), 2 -> 4 tasks
IN = scale(A, "count", 1)  # moves 8 key groups, 2 -> 1 task
MOVE = migrate(A, "count-0", "w2")  # no key group moves
TWO = rebalance(A, "count", {0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0})  # moves 2 key groups
ASYMMETRIC = {"cooldown_s": 60, "scale_out_cooldown_s": 5}


def past(seconds_ago: float, status: str = "completed", moves: int = 0) -> Outcome:
    return Outcome(NOW - seconds_ago, MOVE, status, None, moves)


CASES = [
    # (plan, safety config, history, action, reason fragments)
    (OUT, {}, [], "apply", []),
    (OUT, {"dry_run": True}, [], "dry_run", []),
    (
        OUT,
        {"cooldown_s": 60},
        [past(59.5)],
        "refuse",
        ["cooldown: the last reconfiguration was 59.5 s ago"],
    ),
    (OUT, {"cooldown_s": 60}, [past(61)], "apply", []),
    (OUT, {"cooldown_s": 60}, [past(30, "failed")], "refuse", ["next plan allowed in 30.0 s"]),
    (OUT, {"cooldown_s": 60}, [past(30, "aborted")], "refuse", ["cooldown is 60 s"]),
    (OUT, {"cooldown_s": 60}, [past(30, "dry_run")], "refuse", ["cooldown"]),
    (OUT, {"cooldown_s": 60}, [past(30, "refused")], "apply", []),  # refusals don't count
    (OUT, {"cooldown_s": 0}, [past(1)], "apply", []),
    (OUT, {"cooldown_s": 60}, [past(30)], "refuse", ["the cooldown is 60 s (cooldown_s)"]),
    # A plan that only scales out waits scale_out_cooldown_s; any other, cooldown_s.
    (OUT, ASYMMETRIC, [past(6)], "apply", []),
    (
        OUT,
        ASYMMETRIC,
        [past(4)],
        "refuse",
        [
            "cooldown: the last reconfiguration was 4.0 s ago and the cooldown of a plan "
            "that only scales out is 5 s (scale_out_cooldown_s) (next plan allowed in 1.0 s)"
        ],
    ),
    (
        IN,
        ASYMMETRIC,
        [past(6)],
        "refuse",
        [
            "the cooldown is 60 s (cooldown_s: the plan does more than scale out, which waits "
            "scale_out_cooldown_s, 5 s) (next plan allowed in 54.0 s)"
        ],
    ),
    (IN, ASYMMETRIC, [past(61)], "apply", []),
    (MOVE, ASYMMETRIC, [past(6)], "refuse", ["the cooldown is 60 s (cooldown_s"]),
    (TWO, ASYMMETRIC, [past(6)], "refuse", ["the cooldown is 60 s (cooldown_s"]),
    (OUT, ASYMMETRIC, [past(4, "refused"), past(6)], "apply", []),  # refusals don't count
    (OUT, {"cooldown_s": 60, "scale_out_cooldown_s": 0}, [past(0.1)], "apply", []),
    (
        OUT,
        {"max_parallelism": {"count": 3}},
        [],
        "refuse",
        ["max parallelism: operator 'count' would have 4 task(s), above its maximum of 3"],
    ),
    (OUT, {"max_parallelism": {"*": 4}}, [], "apply", []),
    (
        OUT,
        {"max_parallelism": {"*": 3, "count": 8}},
        [],
        "refuse",
        ["operator 'sink' would have 4 task(s), above its maximum of 3"],  # scaled with count
    ),
    (
        IN,
        {"min_parallelism": {"count": 2}},
        [],
        "refuse",
        ["min parallelism: operator 'count' would have 1 task(s), below its minimum of 2"],
    ),
    (MOVE, {"min_parallelism": {"*": 3}}, [], "apply", []),  # parallelism unchanged
    (TWO, {"max_moves_per_hour": 2}, [], "apply", []),
    (
        OUT,
        {"max_moves_per_hour": 10},
        [past(1000, moves=3)],
        "refuse",
        ["the plan moves 8 key group(s) and 3 moved in the last hour; the limit is 10"],
    ),
    (OUT, {"max_moves_per_hour": 10}, [past(3700, moves=3)], "apply", []),  # over an hour ago
    (OUT, {"max_moves_per_hour": 10}, [past(100, "refused", moves=9)], "apply", []),
    (MOVE, {"max_moves_per_hour": 0}, [], "apply", []),  # a migration moves no key group
    (
        OUT,
        {"cooldown_s": 60, "max_parallelism": {"count": 3}, "dry_run": True},
        [past(10)],
        "refuse",
        ["cooldown", "max parallelism"],  # every broken limit is reported
    ),
    (
        Plan(A.version, (AssignWorkload("count", {"count-0": [0]}),)),
        {},
        [],
        "refuse",
        ["invalid plan: ", "key group"],
    ),
    (Plan(A.version + 1, OUT.ops), {}, [], "refuse", ["invalid plan: the plan is based on"]),
]


@pytest.mark.parametrize(("plan", "config", "history", "action", "fragments"), CASES)
def test_safety_verdicts(
    plan: Plan, config: dict, history: list[Outcome], action: str, fragments: list[str]
) -> None:
    verdict = check(plan, A, SafetyConfig.from_dict(config), history, now=NOW)
    assert verdict.action == action, verdict.reason
    assert verdict.allowed == (action != "refuse")
    for fragment in fragments:
        assert fragment in (verdict.reason or ""), verdict.reason
    if action != "refuse":
        assert verdict.reason is None
        assert verdict.moves == count_moves(A, apply_plan(A, plan))


def test_moves_are_counted_by_diff() -> None:
    assert check(OUT, A, SafetyConfig(), [], now=NOW).moves == 8
    assert check(TWO, A, SafetyConfig(), [], now=NOW).moves == 2
    assert check(MOVE, A, SafetyConfig(), [], now=NOW).moves == 0


def test_safety_config() -> None:
    s = SafetyConfig.from_dict({"min_parallelism": {"*": 2}, "max_parallelism": {"count": 8}})
    assert s.bounds("count") == (2, 8) and s.bounds("split") == (2, float("inf"))
    assert SafetyConfig.from_dict(s.to_dict()) == s
    assert SafetyConfig.from_dict(None) == SafetyConfig()
    assert SafetyConfig().scale_out_cooldown_s is None and SafetyConfig().scale_out_wait_s == 60
    asymmetric = SafetyConfig.from_dict(ASYMMETRIC)
    assert asymmetric.to_dict()["scale_out_cooldown_s"] == 5.0
    assert SafetyConfig.from_dict(asymmetric.to_dict()) == asymmetric
    assert SafetyConfig().to_dict()["scale_out_cooldown_s"] is None
    assert SafetyConfig.from_dict(SafetyConfig().to_dict()) == SafetyConfig()
    for bad, fragment in [
        ({"cooldown_s": -1}, "config.cooldown_s: must be >= 0 seconds, got -1.0"),
        (
            {"scale_out_cooldown_s": -1},
            "config.scale_out_cooldown_s: must be in [0, cooldown_s (60)] seconds (or null: "
            "cooldown_s), got -1.0",
        ),
        (
            {"cooldown_s": 10, "scale_out_cooldown_s": 11},
            "config.scale_out_cooldown_s: must be in [0, cooldown_s (10)] seconds",
        ),
        ({"scale_out_cooldown_s": "3"}, "config.scale_out_cooldown_s: expected a number"),
        ({"min_parallelism": {"count": 0}}, "config.min_parallelism.count: must be >= 1"),
        (
            {"min_parallelism": {"count": 5}, "max_parallelism": {"count": 4}},
            "config.min_parallelism.count: must be <= max_parallelism 4, got 5",
        ),
        ({"max_moves_per_hour": -3}, "config.max_moves_per_hour: must be >= 0"),
        ({"max_state_bytes_per_step": 0}, "config.max_state_bytes_per_step: must be >= 1 byte"),
        ({"dry_run": "yes"}, "config.dry_run: expected true or false"),
        ({"cooldown": 5}, "config.cooldown: unknown field"),
    ]:
        with pytest.raises(ConfigError) as info:
            SafetyConfig.from_dict(bad)
        assert fragment in str(info.value)


def test_keyed_state_shipped_per_step() -> None:
    """``max_state_bytes_per_step``: count-0's 8 key groups hold 8 MB (measured); moving it
    whole ships all of it, through a stand-in 2 key groups a step ships 2 MB a step."""
    limit = SafetyConfig.from_dict({"max_state_bytes_per_step": 4_000_000})
    sizes = key_group_bytes(A, {"count-0": 8e6, "count-1": 8e6})
    verdict = check(MOVE, A, limit, [], now=NOW, sizes=sizes)
    assert verdict.action == "refuse"
    assert verdict.reason == (
        "max state per step: the plan would ship about 8.0 MB of keyed state between "
        "workers; the limit is 4.0 MB (make it fluid with fewer key groups per step)"
    )
    steps = replace(MOVE, mode="fluid", batch_size=2)
    assert check(steps, A, limit, [], now=NOW, sizes=sizes).action == "apply"
    bigger = replace(MOVE, mode="fluid", batch_size=5)
    assert "a step of the plan would ship about 5.0 MB" in (
        check(bigger, A, limit, [], now=NOW, sizes=sizes).reason or ""
    )
    unmeasured = check(MOVE, A, limit, [], now=NOW, sizes=key_group_bytes(A, {"count-1": 8e6}))
    assert "state size was not measured yet" in (unmeasured.reason or "")
    # Moving nothing keyed, or without the limit, state sizes do not matter.
    assert check(MOVE, A, SafetyConfig(), [], now=NOW).action == "apply"
    sink = migrate(A, "sink-0", "w2")
    assert check(sink, A, limit, [], now=NOW, sizes={}).action == "apply"


B = rebalanced(n_workers=3)  # split (3) and count (2, 8 key groups) scale apart


@pytest.mark.parametrize(
    ("base", "plan", "scales_out"),
    [
        (A, OUT, True),  # new tasks and the key groups they take
        (A, scale(A, "count", 3, workers=["new"]), True),  # on a fresh worker
        (B, PlanBuilder(B).scale("split", 5).scale("count", 4).build(), True),
        (A, IN, False),
        (A, MOVE, False),  # a task moved
        (A, TWO, False),  # key groups moved, no task added
        (B, PlanBuilder(B).scale("split", 5).scale("count", 1).build(), False),  # mixed
        (A, PlanBuilder(A).scale("count", 4).migrate("count-0", "w2").build(), False),
        (A, PlanBuilder(A).scale("count", 4).update_logic("count", "mod:fn").build(), False),
    ],
)
def test_only_scales_out(base: Abstraction, plan: Plan, scales_out: bool) -> None:
    assert only_scales_out(diff(base, preview(base, plan))) is scales_out


@given(
    cooldown=st.floats(0, 600),
    share=st.floats(0, 1),
    age=st.floats(0, 700),
)
def test_each_plan_waits_its_own_cooldown(cooldown: float, share: float, age: float) -> None:
    """With ``scale_out_cooldown_s`` S <= ``cooldown_s`` C: a scale-out is allowed from S
    after the last reconfiguration, a scale-in (or a migration) from C; unset, S is C."""
    out_wait = share * cooldown
    both = SafetyConfig(cooldown_s=cooldown, scale_out_cooldown_s=out_wait)
    history = [past(age)]
    age = NOW - history[0].time  # as check computes it (rounding)
    assert check(OUT, A, both, history, now=NOW).allowed == (age >= out_wait)
    assert check(IN, A, both, history, now=NOW).allowed == (age >= cooldown)
    assert check(MOVE, A, both, history, now=NOW).allowed == (age >= cooldown)
    same = SafetyConfig(cooldown_s=cooldown)
    assert check(OUT, A, same, history, now=NOW).allowed == (age >= cooldown)
