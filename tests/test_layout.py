"""The layout's change analysis: affected tasks, and which keyed tasks fluid mode need not
pause (``in_place_owners``)."""

from __future__ import annotations

import pickle

import pytest

from runtime.dataflow import load_job
from runtime.layout import (
    Layout,
    affected_tasks,
    in_place_owners,
    stages_can_overlap,
    sync_only_tasks,
)

GRAPH = load_job("examples.wordcount:build", {"records": 10, "parallelism": 2})
BASE = Layout.initial(GRAPH, ["w1", "w2"])  # x-0 on w1, x-1 on w2 for every operator


def with_groups(layout: Layout, **groups: list[int]) -> Layout:
    a = dict(layout.assignment)
    a.update({t.replace("_", "-"): tuple(g) for t, g in groups.items()})
    return layout.replace(assignment=a)


REBALANCED = with_groups(BASE, count_0=range(32), count_1=range(32, 128))


def scaled_out() -> Layout:
    p, w = dict(BASE.placement), dict(BASE.weights)
    p["count-2"] = p["sink-2"] = "w1"
    w["sink-2"] = 1.0
    lay = BASE.replace(placement=p, weights=w)
    return with_groups(
        lay, count_0=range(48), count_1=range(64, 112), count_2=[*range(48, 64), *range(112, 128)]
    )


def moved(layout: Layout, **where: str) -> Layout:
    p = dict(layout.placement)
    p.update({t.replace("_", "-"): w for t, w in where.items()})
    return layout.replace(placement=p)


@pytest.mark.parametrize(
    ("new", "expected"),
    [
        # Groups move between two count tasks: both go on (their split tasks pause).
        (REBALANCED, {"count-0", "count-1"}),
        # Scale out: the old owners go on; count-2 is new (it starts unpaused, but is not
        # an in-place owner: it has to be created).
        (scaled_out(), {"count-0", "count-1"}),
        # A count task that moves while its groups change pauses (its channels change).
        (moved(REBALANCED, count_1="w1"), {"count-0"}),
        # Its sink moves: count-1's output channel changes, so it pauses; count-0 goes on.
        (moved(REBALANCED, sink_1="w1"), {"count-0"}),
        # Only a placement change: nothing gains or gives key groups.
        (moved(BASE, count_1="w1"), set()),
    ],
    ids=["rebalance", "scale-out", "owner-moves", "sink-moves", "migrate-only"],
)
def test_in_place_owners(new: Layout, expected: set[str]) -> None:
    owners = in_place_owners(GRAPH, BASE, new)
    assert owners == expected
    assert owners <= affected_tasks(GRAPH, BASE, new)


def test_a_logic_swap_takes_a_task_out_of_place() -> None:
    new = REBALANCED.replace(logic={"count-1": pickle.dumps(len)})
    assert in_place_owners(GRAPH, BASE, new) == {"count-0"}


def test_the_downstream_of_a_moving_task_only_syncs() -> None:
    """sink-1 keeps its channel from count-1 when count-1 moves: it must have taken in what
    the old instance sent before the barrier (so it is affected) but changes nothing."""
    new = moved(BASE, count_1="w1")
    assert "sink-1" in affected_tasks(GRAPH, BASE, new)
    assert sync_only_tasks(GRAPH, BASE, new) == {"sink-1"}
    # Moving with it, the sink changes itself; a rebalance moves no task.
    assert sync_only_tasks(GRAPH, BASE, moved(BASE, count_1="w1", sink_1="w1")) == set()
    assert sync_only_tasks(GRAPH, BASE, REBALANCED) == set()


def test_a_stage_barrier_starts_at_the_tasks_routing_to_the_moving_groups() -> None:
    """Word count: the split tasks route to the count tasks, and everything downstream of
    them reads from them only; a graph in which a task downstream also reads another
    source's stream needs the barrier from the sources (None)."""
    from jobs_for_tests import count, first, identity

    from runtime.dataflow import Dataflow
    from runtime.layout import only_key_groups_move, stage_entry
    from runtime.sources import Generator

    assert stage_entry(GRAPH, BASE, REBALANCED) == ["split-0", "split-1"]
    assert only_key_groups_move(BASE, REBALANCED)
    assert not only_key_groups_move(BASE, scaled_out())
    assert not only_key_groups_move(BASE, moved(BASE, count_1="w1"))

    flow = Dataflow("joined")
    counts = (
        flow.source("a", Generator(records=10, keys=2, seed=1))
        .key_by(first)
        .process("count", count, parallelism=2)
    )
    other = flow.source("b", Generator(records=10, keys=2, seed=2))
    flow.union(counts, other).map("merged", identity)
    graph = flow.compile()
    base = Layout.initial(graph, ["w1", "w2"])
    a = dict(base.assignment)
    a["count-0"], a["count-1"] = tuple(range(32)), tuple(range(32, 128))
    assert stage_entry(graph, base, base.replace(assignment=a)) is None

    # Stages of two keyed operators in a row start at different tasks (the source, then the
    # first operator's tasks): the later barrier could overtake the earlier one.
    flow = Dataflow("twice")
    (
        flow.source("a", Generator(records=10, keys=2, seed=1))
        .key_by(first)
        .process("count", count, parallelism=2)
        .key_by(first)
        .process("recount", count, parallelism=2)
    )
    graph = flow.compile()
    base = Layout.initial(graph, ["w1", "w2"])
    a = dict(base.assignment)
    a["count-0"], a["count-1"] = tuple(range(32)), tuple(range(32, 128))
    one = base.replace(assignment=a)
    a["recount-0"], a["recount-1"] = tuple(range(32)), tuple(range(32, 128))
    two = base.replace(assignment=a)
    assert stage_entry(graph, base, one) != stage_entry(graph, one, two)
    assert not stages_can_overlap(graph, (base, one), (one, two))


def test_stages_overlap_when_they_start_alike_and_move_different_key_groups() -> None:
    """Word count: two batches of a rebalance (the split tasks route both) may be under way
    at once; a batch moving a key group the one under way moves (on, or back) may not."""
    half = with_groups(BASE, count_0=range(48), count_1=range(48, 128))  # 48..63 move
    quarter = with_groups(BASE, count_0=range(32), count_1=range(32, 128))  # then 32..47
    back = with_groups(BASE, count_0=range(56), count_1=range(56, 128))  # 48..55 return
    assert stages_can_overlap(GRAPH, (BASE, half), (half, quarter))
    assert not stages_can_overlap(GRAPH, (BASE, half), (half, back))
    assert not stages_can_overlap(GRAPH, (BASE, half), (BASE, half))
