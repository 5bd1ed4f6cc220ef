"""Hot keys: the Space-Saving sketch keeps its guarantees against exact counts whatever the
stream, its capacity and slack; the per-batch sampler counts small batches exactly and
estimates large ones without bias; a keyed task's snapshot reports its heaviest keys with
their key groups in a form msgpack and JSON both carry, and starts afresh."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.codec import packb, unpackb
from runtime.hotkeys import HotKey, HotKeySampler, SpaceSaving
from runtime.keygroups import key_group
from runtime.metrics import HOT_KEY_MAX_CHARS, HOT_KEYS_REPORTED, TaskMetrics

KEYS = [f"k{i}" for i in range(30)]
# A stream: batches of (key, weight); weights 1..20 so that heavy keys form.
streams = st.lists(
    st.lists(st.tuples(st.sampled_from(KEYS), st.integers(1, 20)), max_size=40), max_size=30
)


def assert_guarantees(sketch: SpaceSaving, exact: Counter[str]) -> None:
    """Every key's true count is within its bounds; heavy keys are held."""
    n = sum(exact.values())
    assert sketch.total == n
    assert sketch.floor <= n / sketch.capacity
    for key in KEYS:
        true = exact[key]
        est = sketch.estimate(key)
        if key in sketch:
            assert est.count - est.error <= true <= est.count, (key, est, true)
        else:
            assert true <= sketch.floor, (key, true, sketch.floor)
        if true > n / sketch.capacity:
            assert key in sketch, (key, true, n)


@settings(max_examples=500, deadline=None)
@given(
    stream=streams,
    capacity=st.integers(1, 12),
    slack=st.integers(0, 12),
    whole_batches=st.booleans(),
)
def test_guarantees_hold_after_every_offer(
    stream: list[list[tuple[str, int]]], capacity: int, slack: int, whole_batches: bool
) -> None:
    """Keys offered one at a time, each at its weight, or a batch's keys at once at one
    weight (``offer_each``, as the sampler offers them at its stride)."""
    sketch = SpaceSaving(capacity, slack)
    exact: Counter[str] = Counter()
    for batch in stream:
        if whole_batches:
            weight = batch[0][1] if batch else 1
            batch = [(k, weight) for k, _ in batch]
            sketch.offer_each([k for k, _ in batch], weight)
        else:
            for key, weight in batch:
                sketch.offer(key, weight)
        for key, weight in batch:
            exact[key] += weight
        assert len(sketch) <= capacity + slack
        assert_guarantees(sketch, exact)


@settings(max_examples=200, deadline=None)
@given(stream=streams, capacity=st.integers(1, 12), n=st.integers(0, 15))
def test_top_is_the_largest_counters_largest_first(
    stream: list[list[tuple[str, int]]], capacity: int, n: int
) -> None:
    sketch = SpaceSaving(capacity)
    for batch in stream:
        for key, weight in batch:
            sketch.offer(key, weight)
    before = {k: sketch.estimate(k) for k in KEYS if k in sketch}
    top = sketch.top(n)
    assert len(sketch) <= capacity  # top prunes
    assert len(top) == min(n, len(sketch))
    assert [h.count for h in top] == sorted((h.count for h in top), reverse=True)
    assert all(before[h.key] == h for h in top)  # pruning changes no counter kept
    held = sorted((h.count for h in before.values()), reverse=True)
    assert [h.count for h in top] == held[: len(top)]


def test_a_sketch_with_room_counts_exactly_and_clear_forgets() -> None:
    sketch = SpaceSaving(4)
    for key, weight in [("a", 3), ("b", 1), ("a", 2), ("c", 7)]:
        sketch.offer(key, weight)
    assert sketch.top(10) == [HotKey("c", 7, 0), HotKey("a", 5, 0), HotKey("b", 1, 0)]
    assert sketch.estimate("z") == HotKey("z", 0, 0)
    sketch.clear()
    assert len(sketch) == 0 and sketch.total == 0 and sketch.top(3) == []


def test_small_batches_are_counted_exactly() -> None:
    """A batch under twice the samples is counted whole, at weight 1."""
    sampler = HotKeySampler(capacity=8, samples=4, seed=1)
    batches = [["a", "b", "a"], ["a", "c", "b", "a", "a", "d", "a"], ["b"]]
    for batch in batches:
        sampler.feed(str.lower, batch)
    exact = Counter(k for b in batches for k in b)
    assert sampler.take(3) == [HotKey(k, n, 0) for k, n in exact.most_common(3)]
    assert sampler.take(3) == []  # afresh


def test_sampled_counts_estimate_the_whole_input_without_bias() -> None:
    """Large batches are sampled (every stride-th record from a random offset): even a
    stream whose hot key sits at the same place of every batch is estimated right."""
    rng = random.Random(7)
    sampler = HotKeySampler(capacity=16, samples=8, seed=3)
    exact: Counter[str] = Counter()
    for _ in range(3000):
        batch = [f"w{min(int(rng.paretovariate(1.2)), 999)}" for _ in range(512)]
        batch[::64] = ["periodic"] * 8  # 1/64 of the input, where a fixed stride would look
        exact.update(batch)
        sampler.feed(str, batch)
    total = sum(exact.values())
    top = {h.key: h for h in sampler.take(16)}
    for key, true in [*exact.most_common(3), ("periodic", exact["periodic"])]:
        assert key in top, (key, true, top)
        # Sampled 1 in 64: about 24,000 samples, so a share is off by well under 1%.
        assert abs(top[key].count - true) / total < 0.01, (key, top[key], true)
        assert top[key].error <= top[key].count


def test_a_keyed_task_reports_its_hot_keys_and_their_groups_once() -> None:
    m = TaskMetrics(max_parallelism=16)
    keys = ["hot"] * 20 + ["warm"] * 5 + [("a", 1)] * 3 + [b"raw"] * 2 + [math.nan, 2**70]
    long = "x" * (HOT_KEY_MAX_CHARS + 1)
    keys.append(long)
    for i in range(0, len(keys), 10):  # batches small enough to be counted whole
        m.hot_keys.feed(lambda v: v, keys[i : i + 10])
    snap = unpackb(packb(m.snapshot({})))
    json.dumps(snap, allow_nan=False)  # JSON carries every reported key
    hot = snap["hot_keys"]
    assert len(hot) == 7 <= HOT_KEYS_REPORTED
    assert hot[0] == {"key": "hot", "group": key_group("hot", 16), "count": 20, "error": 0}
    assert hot[1] == {"key": "warm", "group": key_group("warm", 16), "count": 5, "error": 0}
    assert hot[2] == {"key": ("a", 1), "group": key_group(("a", 1), 16), "count": 3, "error": 0}
    assert hot[3] == {
        "key": "b'raw'",
        "group": key_group(b"raw", 16),
        "count": 2,
        "error": 0,
        "repr": True,
    }
    shown = {h["key"]: h.get("repr", False) for h in hot[4:]}
    assert shown == {"nan": True, repr(2**70): True, repr(long)[:HOT_KEY_MAX_CHARS]: True}
    assert "hot_keys" not in TaskMetrics().snapshot({})  # not keyed
    assert m.snapshot({})["hot_keys"] == ()  # the window starts afresh
