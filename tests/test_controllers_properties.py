"""Invariants of the built-in controllers on random jobs and metrics (hypothesis): every
plan they return validates and keeps every key group owned exactly once."""

from __future__ import annotations

import json

from controllers_support import task, view_of, window, wordcount
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers import BUILTINS, Controller, Plan, View, count_moves, decision_of
from controlplane.abstraction import Abstraction, AssignWorkload, apply_plan

CONFIGS = {
    "load_balancer": [
        {},
        {"time_aware": False},
        {"threshold": 0.0, "target": 0.0},
        {"threshold": 0.0, "target": 0.0, "max_moves": 2},
    ],
    "latency_autoscaler": [
        {"overload_window": 1, "overload_factor": 0.0, "max_latency_ms": 100.0},
        {"underload_window": 1, "low_watermark": 0.9},
    ],
    "ds2_autoscaler": [
        {"max_latency_ms": 100.0},
        {"scale_in_periods": 1, "cooldown_s": 0.0},
    ],
    "flink_autoscaler": [
        {"stabilization_interval_s": 0, "metrics_window_s": 0, "scale_down_interval_s": 0}
    ],
    "dsc_placement": [{"min_gain": 0.0}, {"alpha": 0.5, "min_gain": 0.0}],
    "logic_updater": [{"logic": {"count": "examples.wordcount:count_word_v2"}}],
}


@st.composite
def jobs(draw: st.DrawFn) -> Abstraction:
    """Word count with random parallelism, key groups, workers, slots and ownership."""
    p = draw(st.integers(1, 4))
    mp = draw(st.integers(p, 24))
    n_workers = draw(st.integers(1, 4))
    most = 4 * -(-p // n_workers)  # tasks on the busiest worker (task i on worker i mod n)
    slots = draw(st.integers(most, most + 4))  # room for the job, maybe tight
    a = wordcount(parallelism=p, max_parallelism=mp, n_workers=n_workers, slots=slots)
    owner = draw(st.lists(st.integers(0, p - 1), min_size=mp, max_size=mp))
    groups = {f"count-{i}": [g for g in range(mp) if owner[g] == i] for i in range(p)}
    if groups != {t.id: list(t.workload.key_groups or ()) for t in a.operator("count").tasks}:
        a = apply_plan(a, Plan(a.version, (AssignWorkload("count", groups),)))
    return a


@st.composite
def views(draw: st.DrawFn, a: Abstraction) -> View:
    """Random metrics for every task of ``a``: busy, key-group loads, traffic, latency."""
    rate = st.floats(0.0, 500.0, allow_nan=False)
    tasks = []
    for op in a.operators:
        for t in op.tasks:
            loads = {g: draw(rate) for g in t.workload.key_groups or ()}
            tasks.append(
                task(
                    t.id,
                    in_per_s=draw(rate),
                    busy=draw(st.floats(0.0, 1.0)),
                    groups=loads or None,
                    worker=t.worker,
                    queued=draw(st.integers(0, 1000)),
                )
            )
    ids = [t.task for t in tasks]
    traffic = draw(
        st.dictionaries(st.tuples(st.sampled_from(ids), st.sampled_from(ids)), rate, max_size=12)
    )
    traffic = {(s, t): v for (s, t), v in traffic.items() if s != t}
    p99 = draw(st.none() | st.floats(0.0, 2000.0))
    return view_of(a, window(tasks, traffic=traffic, p99_ms=p99))


def check_plan(a: Abstraction, plan: Plan, max_moves: int | None = None) -> None:
    b = apply_plan(a, plan)  # every ref the built-ins name resolves
    if max_moves is not None:
        assert count_moves(a, b) <= max_moves
    for op in b.operators:
        if op.keyed:
            owned = [g for t in op.tasks for g in t.workload.key_groups or ()]
            assert sorted(owned) == list(range(op.max_parallelism or 0))
    for w in b.workers:
        assert len(b.tasks_on(w.id)) <= max(w.slots, len(a.tasks_on(w.id)))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(BUILTINS)))
def test_builtin_plans_always_validate(data: st.DataObject, name: str) -> None:
    a = data.draw(jobs())
    config = data.draw(st.sampled_from(CONFIGS[name]))
    controller: Controller = BUILTINS[name](config)
    first = data.draw(views(a))
    controller.on_start(first)
    for view in [first, *(data.draw(views(a)) for _ in range(2))]:
        plan = decision_of(controller.decide(view), view)
        if plan is not None:
            check_plan(a, plan, config.get("max_moves"))


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_random_views_round_trip_through_json(data: st.DataObject) -> None:
    view = data.draw(views(data.draw(jobs())))
    assert View.from_dict(json.loads(json.dumps(view.to_dict()))) == view
