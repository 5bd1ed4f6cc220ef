"""Key groups whose state is on its way (fluid mode): their records wait, the others go
on, and once every group has arrived each key has seen exactly its records, in order, as
if the state had been there all along (``KeyedProcessor.await_groups`` / ``arrive``)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.channels import OutputChannel
from runtime.dataflow import OperatorSpec
from runtime.keygroups import key_group_fn
from runtime.metrics import TaskMetrics
from runtime.operators import KeyedProcessor
from runtime.partitioning import ForwardEdge, Outputs
from runtime.state import KeyedState

GROUPS = 8
KEYS = [f"k{i}" for i in range(24)]
group_of = key_group_fn(GROUPS)


def count(key: str, value: tuple[str, int], state: Any) -> tuple:
    n = state.get(0) + 1
    state.set(n)
    return ((key, n, value[1]),)


def processor(owned: set[int]) -> tuple[KeyedProcessor, OutputChannel]:
    ch = OutputChannel("j/count-0>next-0", "next-0", credits=1)
    outputs = Outputs([ForwardEdge("next", [ch])], batch_size=1 << 30, linger_s=3600.0)
    op = OperatorSpec("count", "keyed", count, max_parallelism=GROUPS)
    state = KeyedState("count-0", owned)
    return KeyedProcessor("count-0", op, outputs, TaskMetrics(GROUPS), state), ch


def arriving(group: int) -> dict[str, int]:
    """The state a group brings along: its keys have counted to 1000 elsewhere."""
    return {k: 1000 for k in KEYS if group_of(k) == group}


def per_key(outputs: list) -> dict[str, list]:
    seen: dict[str, list] = {}
    for key, n, seq in outputs:
        seen.setdefault(key, []).append((n, seq))
    return seen


@settings(max_examples=80, deadline=None)
@given(
    keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=200),
    awaited=st.sets(st.integers(0, GROUPS - 1), min_size=1),
    cuts=st.lists(st.integers(1, 40), min_size=1, max_size=10),
    when=st.lists(st.integers(0, 12), min_size=GROUPS, max_size=GROUPS),
)
def test_awaited_groups_keep_each_keys_records_whole_and_in_order(
    keys: list[str], awaited: set[int], cuts: list[int], when: list[int]
) -> None:
    records = [(k, seq) for seq, k in enumerate(keys)]
    batches, i, c = [], 0, 0
    while i < len(records):
        batches.append(records[i : i + cuts[c % len(cuts)]])
        i, c = i + cuts[c % len(cuts)], c + 1
    # Reference: every group's state there from the start.
    ref, ref_out = processor(set(range(GROUPS)))
    for g in awaited:
        ref.state.groups()[g] = arriving(g)
    for b in batches:
        ref.process(lambda r: r[0], b, [0.0] * len(b))
    # Under test: the awaited groups arrive between batches (group g after batch when[g]).
    proc, out = processor(set(range(GROUPS)) - awaited)
    proc.await_groups(awaited)
    for step, b in enumerate([*batches, *([[]] * 13)]):
        if b:
            proc.process(lambda r: r[0], b, [0.0] * len(b))
        for g in sorted(awaited):
            if when[g] == step and g in proc.awaiting:
                proc.arrive(g, arriving(g))
    assert proc.awaiting == {}
    assert per_key(out.buf_v) == per_key(ref_out.buf_v)
    assert sorted(out.buf_v) == sorted(ref_out.buf_v)


def test_exported_bytes_arrive_too_and_cancel_counts_what_waited() -> None:
    donor = KeyedState("count-1", [3])
    donor.groups()[3] = {"a": 7}
    proc, out = processor({0})
    proc.await_groups([3])
    assert proc.cancel_awaiting() == 0 and proc.awaiting == {}
    proc.await_groups([3])
    proc.awaiting[3].append(("a", ("a", 1), 0.0))  # as process() would have buffered it
    proc.arrive(3, donor.export_group(3))
    assert proc.state.group(3) == {"a": 8} and out.buf_v == [("a", 8, 1)]
