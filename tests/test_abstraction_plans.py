"""Invariants of plans over random jobs and random sequences of helper-built plans:
key-group coverage, versions, JSON, minimal moves, refusal of invalid plans, and the diff
checked against an oracle written here independently (from channel pairs)."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from controlplane.abstraction import (
    NEW_WORKER,
    Abstraction,
    AssignLogic,
    AssignResource,
    AssignWorkload,
    KeyGroupConflict,
    Plan,
    PlanError,
    StaleVersion,
    TaskStillOwnsWork,
    UnknownTask,
    Worker,
    WorkerOverCapacity,
    apply_plan,
    check_abstraction,
    diff,
    from_graph,
    imbalance,
    migrate,
    rebalance,
    scale,
    update_logic,
)
from examples import wordcount
from runtime.dataflow import Dataflow, JobGraph, load_job
from runtime.layout import Layout
from runtime.sinks import Null
from runtime.sources import Generator

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REFS = {  # valid logic per operator that may change logic
    "split": ["examples.wordcount:split_words", "jobs_for_tests:split_words"],
    "count": ["examples.wordcount:count_word", "jobs_for_tests:count"],
    "match": ["examples.stock_exchange:match_order", "jobs_for_tests:count"],
    "stats": ["examples.stock_exchange:update_stats", "jobs_for_tests:count"],
    "alerts": ["jobs_for_tests:split_words"],
}


@functools.cache
def graph(kind: str, parallelism: int, max_parallelism: int) -> JobGraph:
    params = {"parallelism": parallelism, "max_parallelism": max_parallelism}
    if kind == "wordcount":
        return load_job("examples.wordcount:build", params)
    if kind == "stock":
        return load_job("examples.stock_exchange:build", params)
    flow = Dataflow("rebalanced")
    lines = flow.source("lines", Generator(records=10), parallelism=1)
    words = lines.rebalance().flat_map("split", wordcount.split_words, parallelism=parallelism + 1)
    counts = words.key_by(wordcount.word_key).process(
        "count", wordcount.count_word, parallelism=parallelism, max_parallelism=max_parallelism
    )
    counts.rebalance().sink("out", Null(), parallelism=2)
    return flow.compile()


@st.composite
def deployments(draw: Any) -> Abstraction:
    kind = draw(st.sampled_from(["wordcount", "stock", "rebalanced"]))
    mp = draw(st.sampled_from([3, 8, 16, 128]))
    g = graph(kind, draw(st.integers(1, min(3, mp))), mp)
    n = draw(st.integers(1, 4))
    slots = draw(st.sampled_from([6, 12, 64]))
    ws = [Worker(f"w{i}", f"h{i}", 1.0, 1024, "local", "alive", slots) for i in range(n)]
    a = from_graph("job", g, Layout.initial(g, [w.id for w in ws]), ws)
    assume(all(len(a.tasks_on(w.id)) <= slots for w in ws))
    return a


# -- oracles, written without the package's own diff or balancing code ---------------------------


def owners(a: Abstraction, operator: str) -> Counter[int]:
    return Counter(g for t in a.operator(operator).tasks for g in t.workload.key_groups or ())


def assert_invariants(old: Abstraction, new: Abstraction) -> None:
    check_abstraction(new)
    assert new.version == old.version + 1
    assert Abstraction.from_dict(new.to_dict()) == new
    for op in new.operators:
        if op.keyed:
            assert owners(new, op.name) == Counter(range(op.max_parallelism or 0))
        indices = [t.index for t in op.tasks]
        assert indices == list(range(len(indices)))


def channels(a: Abstraction) -> set[tuple[str, str]]:
    pairs = set()
    for op in a.operators:
        for inp in op.inputs:
            for d in op.tasks:
                for u in a.operator(inp.upstream).tasks:
                    if inp.partitioning != "forward" or u.index == d.index:
                        pairs.add((u.id, d.id))
    return pairs


def expected_effects(old: Abstraction, new: Abstraction) -> dict[str, set[str]]:
    """docs/design.md, section 3 step 1, from the tasks' states and the channel pairs of both
    sides."""
    so = {t.id: t for op in old.operators for t in op.tasks}
    sn = {t.id: t for op in new.operators for t in op.tasks}
    both = so.keys() & sn.keys()

    def work(s: dict, t: str) -> Any:
        if t not in s:
            return None
        wl = s[t].workload
        return frozenset(wl.key_groups) if wl.keyed else wl.weight

    def same_work(t: str) -> bool:
        a, b = work(so, t), work(sn, t)
        empty = frozenset() if isinstance(a if a is not None else b, frozenset) else 0.0
        return (empty if a is None else a) == (empty if b is None else b)

    work_changed = {t for t in so.keys() | sn.keys() if not same_work(t)}
    place = (so.keys() ^ sn.keys()) | {t for t in both if so[t].worker != sn[t].worker}
    logic = {t for t in both if so[t].logic != sn[t].logic}
    pairs = channels(old) | channels(new)
    up = {u for u, d in pairs if d in work_changed | place and u in both}
    down = {d for u, d in pairs if u in place and d in both}
    return {
        "direct": work_changed | place | logic,
        "up": up,
        "down": down,
        "affected": work_changed | place | logic | up | down,
    }


def named_tasks(a: Abstraction, b: Abstraction, plan: Plan) -> set[str]:
    named: set[str] = set()
    for op in plan.ops:
        if isinstance(op, AssignWorkload):
            named |= set(op.workload)
        elif isinstance(op, AssignResource):
            named.add(op.task)
        elif op.tasks == "all":
            named |= set(a.operator(op.operator).task_ids) | set(b.operator(op.operator).task_ids)
        else:
            named |= set(op.tasks)
    return named


def assert_diff(old: Abstraction, new: Abstraction, plan: Plan) -> None:
    d = diff(old, new)
    want = expected_effects(old, new)
    assert d.affected == want["affected"]
    assert d.upstream_routing_changes == want["up"]
    assert d.downstream_channel_changes == want["down"]
    assert want["direct"] <= named_tasks(old, new, plan)
    for op in old.operators:
        if op.keyed:  # the moves turn the old owner table into the new one
            table = old.owner_of(op.name)
            for g, src, dst in d.operator(op.name).key_group_moves:
                assert table[g] == src
                table[g] = dst
            assert table == new.owner_of(op.name)


def minimal_moves(counts: list[int], total: int) -> int:
    """Fewest key groups to move so that ``len(counts)`` tasks own ``total`` evenly."""
    base, extra = divmod(total, len(counts))
    gains = sorted((min(c, base + 1) - min(c, base) for c in counts), reverse=True)
    return total - sum(min(c, base) for c in counts) - sum(gains[:extra])


# -- random sequences of helper-built plans --------------------------------------------------------


def scalable(a: Abstraction) -> list[str]:
    return [
        op.name
        for op in a.operators
        if all(a.operator(m).kind != "source" for m in a.forward_group(op.name))
    ]


def random_step(draw: Any, a: Abstraction) -> tuple[str, Plan, dict[str, Any]]:
    action = draw(st.sampled_from(["scale", "rebalance", "rebalance", "migrate", "logic"]))
    worker_ids = [w.id for w in a.workers]
    if action == "scale" and scalable(a):
        name = draw(st.sampled_from(scalable(a)))
        limit = min([6] + [a.operator(m).max_parallelism or 6 for m in a.forward_group(name)])
        n = draw(st.integers(1, limit))
        targets = draw(
            st.none() | st.lists(st.sampled_from([*worker_ids, NEW_WORKER]), min_size=1, max_size=3)
        )
        return action, scale(a, name, n, workers=targets), {"operator": name, "n": n}
    if action == "rebalance":
        candidates = [
            op
            for op in a.operators
            if op.keyed or any(i.partitioning == "rebalance" for i in op.inputs)
        ]
        op = draw(st.sampled_from(candidates))
        threshold = draw(st.sampled_from([0.0, 0.1, 0.5]))
        loads = None
        if draw(st.integers(0, 3)):
            keys = (
                st.integers(0, (op.max_parallelism or 1) - 1)
                if op.keyed
                else st.sampled_from(op.task_ids)
            )
            values = st.floats(0.5, 100) if op.keyed else st.floats(0.01, 10)
            loads = draw(st.dictionaries(keys, st.just(0.0) | values, min_size=1, max_size=40))
        plan = rebalance(a, op.name, loads, threshold=threshold)
        return action, plan, {"operator": op.name, "loads": loads, "threshold": threshold}
    if action == "logic":
        name = draw(st.sampled_from([op.name for op in a.operators if op.name in REFS]))
        ids = a.operator(name).task_ids
        tasks = draw(st.none() | st.lists(st.sampled_from(ids), min_size=1, unique=True))
        return action, update_logic(a, name, draw(st.sampled_from(REFS[name])), tasks), {}
    task = draw(st.sampled_from(sorted(t.id for op in a.operators for t in op.tasks)))
    worker, chained = draw(st.sampled_from([*worker_ids, NEW_WORKER])), draw(st.booleans())
    plan = migrate(a, task, worker, with_forward=chained)
    return "migrate", plan, {"task": task, "with_forward": chained}


def check_step(action: str, a: Abstraction, b: Abstraction, info: dict[str, Any]) -> None:
    if action == "scale":
        for name in a.forward_group(info["operator"]):
            op = a.operator(name)
            assert b.operator(name).parallelism == info["n"]
            if op.keyed:
                counts = [len(t.workload.key_groups or ()) for t in op.tasks]
                survivors = counts[: info["n"]] + [0] * max(0, info["n"] - len(counts))
                moved = len(diff(a, b).operator(name).key_group_moves)
                assert moved == minimal_moves(survivors, op.max_parallelism or 0)
                after = [len(t.workload.key_groups or ()) for t in b.operator(name).tasks]
                assert max(after) - min(after) <= 1
            else:
                assert all(t.workload.weight == 1.0 for t in b.operator(name).tasks)
    if action == "migrate":  # the task and, when asked, its forward partners share a worker
        moved = a.task(info["task"])
        index = moved.id.rsplit("-", 1)[1]
        group = a.forward_group(moved.operator) if info["with_forward"] else (moved.operator,)
        ids = {f"{name}-{index}" for name in group}
        assert len({b.task(t).worker for t in ids}) == 1
        others = [t for op in a.operators for t in op.tasks if t.id not in ids]
        assert all(b.task(t.id).worker == t.worker for t in others)
    if action == "rebalance" and a.operator(info["operator"]).keyed:
        name, loads = info["operator"], info["loads"]
        if loads is None:
            counts = [len(t.workload.key_groups or ()) for t in a.operator(name).tasks]
            moved = len(diff(a, b).operator(name).key_group_moves)
            assert moved == minimal_moves(counts, sum(counts))
            return

        def task_loads(x: Abstraction) -> list[float]:
            return [
                sum(loads.get(g, 0.0) for g in t.workload.key_groups or ())
                for t in x.operator(name).tasks
            ]

        before, after = task_loads(a), task_loads(b)
        assert max(after) <= max(before) + 1e-9
        if imbalance(after) > info["threshold"]:  # stopped because no single move helps
            hi = after.index(max(after))
            gap = max(after) - min(after)
            groups = b.operator(name).tasks[hi].workload.key_groups or ()
            assert not [g for g in groups if 0 < loads.get(g, 0.0) < gap - 1e-9 * max(1.0, gap)]


@SETTINGS
@given(deployments(), st.data())
def test_random_helper_plans_keep_every_invariant(a: Abstraction, data: st.DataObject) -> None:
    for _ in range(data.draw(st.integers(1, 5))):
        try:
            action, plan, info = random_step(data.draw, a)
        except WorkerOverCapacity as exc:  # scale found no worker with room: refused, named
            assert "no worker has room" in str(exc)
            continue
        if not plan:
            continue
        try:
            b = apply_plan(a, plan)
        except WorkerOverCapacity as exc:  # explicit targets may be full: refused, named
            assert action in ("scale", "migrate") and "slots" in str(exc)
            continue
        assert_invariants(a, b)
        assert_diff(a, b, plan)
        check_step(action, a, b, info)
        a = b


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8])
def test_scale_moves_exactly_the_minimum(n: int) -> None:
    g = graph("wordcount", 3, 8)
    ws = [Worker(f"w{i}", "h", 1.0, 1, "local") for i in range(3)]
    a = from_graph("job", g, Layout.initial(g, ["w0", "w1", "w2"]), ws)  # 2, 3, 3 groups
    b = apply_plan(a, scale(a, "count", n)) if n != 3 else a
    moved = len(diff(a, b).operator("count").key_group_moves)
    need = {1: 6, 2: 3, 3: 0, 5: 2, 7: 4, 8: 5}[n]  # sum of max(0, owned - target)
    assert moved == need == minimal_moves([2, 3, 3][:n] + [0] * max(0, n - 3), 8)


# -- random invalid plans -------------------------------------------------------------------------


@SETTINGS
@given(deployments(), st.data())
def test_invalid_plans_are_refused_and_change_nothing(a: Abstraction, data: st.DataObject) -> None:
    draw = data.draw
    try:  # first move somewhere random, when possible
        _, plan, _ = random_step(draw, a)
        a = apply_plan(a, plan) if plan else a
    except WorkerOverCapacity:
        pass
    snapshot = a.to_dict()
    keyed = [op for op in a.operators if op.keyed]
    defect = draw(st.sampled_from(["twice", "unknown", "removal", "stale"]))
    logic_op = AssignLogic(keyed[0].name, "all", REFS[keyed[0].name][0])
    if defect == "twice":
        op = draw(st.sampled_from(keyed))
        owning = [t for t in op.tasks if t.workload.key_groups]
        assume(len(owning) >= 2)
        x, y = draw(st.permutations(owning))[:2]
        g = draw(st.sampled_from(y.workload.key_groups))
        bad: Any = AssignWorkload(op.name, {x.id: [*x.workload.key_groups, g]})
        expected: type[PlanError] = KeyGroupConflict
        fragments = [str(g), repr(x.id), repr(y.id)]
    elif defect == "unknown":
        op = draw(st.sampled_from([o for o in a.operators if o.kind != "source"]))
        ghost = f"{op.name}-{op.parallelism + draw(st.integers(0, 5))}"
        bad = draw(
            st.sampled_from(
                [
                    AssignResource(op.name, ghost, None),
                    AssignWorkload(op.name, {ghost: [0] if op.keyed else 1.0}),
                ]
            )
        )
        expected, fragments = UnknownTask, [ghost]
    elif defect == "removal":
        candidates = [
            t for o in a.operators if o.kind != "source" for t in o.tasks if t.workload.owns_work
        ]
        t = draw(st.sampled_from(candidates))
        bad, expected, fragments = AssignResource(t.operator, t.id, None), TaskStillOwnsWork, [t.id]
    else:
        bad, expected, fragments = logic_op, StaleVersion, [f"version {a.version}"]
    ops = [logic_op] * draw(st.integers(0, 1)) + [bad] + [logic_op] * draw(st.integers(0, 1))
    version = a.version + draw(st.sampled_from([-1, 1, 2])) if defect == "stale" else a.version
    assume(version >= 1)
    with pytest.raises(expected) as info:
        apply_plan(a, Plan(version, tuple(ops)))
    assert type(info.value) is expected
    assert all(f in str(info.value) for f in fragments), str(info.value)
    assert a.to_dict() == snapshot
