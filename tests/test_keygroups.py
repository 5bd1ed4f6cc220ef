"""Key groups: a stable hash identical in every process, the cached hasher agreeing with
it, and the split / owner-table helpers covering every key group exactly once."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jobs_for_tests import MIXED_KEYS, Point

from runtime.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    KeyGroupHasher,
    UnsupportedKeyError,
    contiguous_split,
    key_group,
    key_group_fn,
    owner_table,
    stable_hash,
)

TESTS = Path(__file__).parent
ROOT = TESTS.parent

_CHILD = """
from jobs_for_tests import MIXED_KEYS
from runtime.keygroups import KeyGroupHasher, key_group, stable_hash
print(repr([
    (stable_hash(k), key_group(k, 128), key_group(k, 7), KeyGroupHasher(128)(k))
    for k in MIXED_KEYS
]))
"""

scalar_keys = st.one_of(
    st.text(),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3),
    st.binary(max_size=32),
    st.integers(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
)
keys = st.recursive(
    scalar_keys, lambda inner: st.tuples(inner, inner) | st.tuples(inner), max_leaves=6
)
# Keys never equal across types (no bool, float or None next to int): one hasher may see
# many of them without meeting the 1 == True cache conflation (tested on its own below).
unambiguous_keys = st.recursive(
    st.one_of(st.text(), st.binary(max_size=32), st.integers()),
    lambda inner: st.tuples(inner, inner),
    max_leaves=4,
)


def hashes_in_child(seed: str) -> list[tuple[int, int, int, int]]:
    env = {
        **os.environ,
        "PYTHONHASHSEED": seed,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),
    }
    out = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return ast.literal_eval(out.stdout)


def test_key_groups_are_identical_in_every_process() -> None:
    here = [
        (stable_hash(k), key_group(k, 128), key_group(k, 7), KeyGroupHasher(128)(k))
        for k in MIXED_KEYS
    ]
    for seed in ("0", "1", "random"):
        assert hashes_in_child(seed) == here, f"PYTHONHASHSEED={seed}"


# (key, stable_hash) pairs; a list, not a dict, since 1 == True.
PINNED = [
    ("word", 4960047609084747341),
    ("\udc80", 7743711754167495139),
    (b"word", 3283610192079319555),
    (1, 13675896972226055329),
    (-1, 11558746578063466769),
    (1.5, 2480958167558177595),
    (None, 1636549453969407356),
    (True, 6579032219474710395),
    (("a", 1), 11791986490580366791),
]


def test_known_hashes_never_change() -> None:
    """A change here would move the state of every key of every running job."""
    assert [(k, stable_hash(k)) for k, _ in PINNED] == PINNED
    assert [key_group(k) for k, _ in PINNED] == [h % 128 for _, h in PINNED]


@settings(max_examples=300, deadline=None)
@given(keys, st.integers(1, 4096))
def test_hasher_agrees_with_key_group_and_caches(key: object, n: int) -> None:
    hasher = key_group_fn(n)
    g = key_group(key, n)
    assert 0 <= g < n
    assert hasher(key) == g
    if type(key) is str:  # only strings are cached (1, 1.0 and True are equal in a dict)
        assert hasher.cache[key] == g
    else:
        assert key not in hasher.cache
    assert hasher(key) == g  # from the cache for strings
    assert KeyGroupHasher(n)(key) == g  # a fresh (uncached) hasher


@settings(max_examples=100, deadline=None)
@given(st.lists(unambiguous_keys, max_size=30), st.integers(1, 512))
def test_hasher_over_a_key_stream_equals_uncached(stream: list, n: int) -> None:
    hasher = KeyGroupHasher(n)
    assert [hasher(k) for k in stream + stream] == [key_group(k, n) for k in stream + stream]


def test_default_max_parallelism() -> None:
    assert DEFAULT_MAX_PARALLELISM == 128
    assert key_group("word") == key_group("word", 128)


def test_equal_keys_of_different_types_hash_by_their_own_encoding() -> None:
    """1 == 1.0 == True in Python, but each type has its own encoding, so their key
    groups may differ; what is guaranteed is that each is deterministic."""
    for k in (1, 1.0, True, 0, 0.0, -0.0, False):
        assert key_group(k, 1024) == key_group(k, 1024)
        assert KeyGroupHasher(1024)(k) == key_group(k, 1024)
    assert stable_hash(1) != stable_hash(1.0) != stable_hash(True)


@pytest.mark.parametrize(
    "seen_first, then", [(1, True), (1, 1.0), (0.0, -0.0), (("a", 1), ("a", True))]
)
def test_hasher_does_not_conflate_equal_keys_of_different_types(seen_first, then) -> None:
    hasher = KeyGroupHasher(1024)
    hasher(seen_first)
    assert hasher(then) == key_group(then, 1024)


@pytest.mark.parametrize("key", [{1, 2}, frozenset({1}), [1, 2], {"a": 1}, Point(1, 2), object()])
def test_unsupported_key_type_is_named(key: object) -> None:
    with pytest.raises(UnsupportedKeyError) as info:
        key_group(key)
    assert type(key).__name__ in str(info.value)
    assert isinstance(info.value, TypeError)


def test_unsupported_key_inside_a_tuple_is_named() -> None:
    with pytest.raises(UnsupportedKeyError, match="type Point"):
        key_group(("a", Point(1, 2)))
    with pytest.raises(UnsupportedKeyError, match="type Point"):
        KeyGroupHasher(8)(("a", Point(1, 2)))


@pytest.mark.parametrize("key", [frozenset({1}), Point(1, 2), object()])
def test_hasher_names_unsupported_hashable_key_types(key: object) -> None:
    with pytest.raises(UnsupportedKeyError, match=type(key).__name__):
        KeyGroupHasher(8)(key)


@pytest.mark.parametrize("key", [{1, 2}, [1, 2], {"a": 1}, ("a", [1])])
def test_hasher_names_unsupported_unhashable_key_types(key: object) -> None:
    with pytest.raises(UnsupportedKeyError):
        KeyGroupHasher(8)(key)


def test_very_large_int_keys_have_a_key_group() -> None:
    assert 0 <= key_group(10**5000) < DEFAULT_MAX_PARALLELISM


# ---------------------------------------------------------------- contiguous_split


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2048).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m))))
def test_contiguous_split_covers_every_group_once(mp: tuple[int, int]) -> None:
    max_parallelism, parallelism = mp
    split = contiguous_split(max_parallelism, parallelism)
    assert len(split) == parallelism
    assert [g for part in split for g in part] == list(range(max_parallelism))
    sizes = [len(part) for part in split]
    assert max(sizes) - min(sizes) <= 1
    assert min(sizes) >= 1


@pytest.mark.parametrize("parallelism", [0, -1, 129])
def test_contiguous_split_refuses_parallelism_out_of_range(parallelism: int) -> None:
    with pytest.raises(ValueError, match=f"parallelism {parallelism} must be between 1 and"):
        contiguous_split(128, parallelism)


# ---------------------------------------------------------------- owner_table


def test_owner_table_inverts_an_assignment() -> None:
    assert owner_table([[0, 3], [2], [1]], 4) == [0, 2, 1, 0]
    assert owner_table([[], [0, 1]], 2) == [1, 1]  # a task may own nothing


def test_owner_table_names_a_group_owned_twice() -> None:
    with pytest.raises(ValueError, match="key group 2 is owned by tasks 0 and 1"):
        owner_table([[0, 2], [1, 2, 3]], 4)


def test_owner_table_names_groups_owned_by_nobody() -> None:
    with pytest.raises(ValueError, match=r"key groups \[1, 3\] are owned by no task"):
        owner_table([[0], [2]], 4)


@pytest.mark.parametrize("group", [-1, 4, 100])
def test_owner_table_names_a_group_out_of_range(group: int) -> None:
    with pytest.raises(ValueError, match=f"key group {group} is outside 0..3"):
        owner_table([[0, 1, 2, 3], [group]], 4)


@st.composite
def assignments(draw: st.DrawFn) -> tuple[list[list[int]], int]:
    """A random partition of range(n) over tasks (any sets, not only ranges)."""
    n = draw(st.integers(1, 128))
    tasks = draw(st.integers(1, 16))
    owners = draw(st.lists(st.integers(0, tasks - 1), min_size=n, max_size=n))
    groups: list[list[int]] = [[] for _ in range(tasks)]
    for g in draw(st.permutations(range(n))):
        groups[owners[g]].append(g)
    return groups, n


@settings(max_examples=120, deadline=None)
@given(assignments())
def test_owner_table_inverts_any_partition(assignment: tuple[list[list[int]], int]) -> None:
    groups, n = assignment
    owner = owner_table(groups, n)
    assert len(owner) == n
    for task, owned in enumerate(groups):
        for g in owned:
            assert owner[g] == task
    assert sorted(owner_table(contiguous_split(n, 1), n)) == [0] * n
