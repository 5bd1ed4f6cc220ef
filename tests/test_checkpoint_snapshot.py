"""Incremental checkpoint snapshots of keyed state (:mod:`runtime.checkpoints.snapshot`).

The property test drives a few key groups' dicts the way a keyed task does: records set
and clear keys and change list values in place, each key they touch noted; at random
checkpoints every group is captured (full when it is not tracked or is compacted, else a
delta of its touched keys) and a deep copy of the state at that moment remembered; later,
after more changes, the captures are encoded as parts, each group's segment read out of
its part by its index entry, and every checkpoint's state is rebuilt from its chain.
"""

from __future__ import annotations

import copy
import pickle
import struct
import threading
from collections import defaultdict, namedtuple

import numpy as np
import pytest
import xxhash
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from runtime.checkpoints.snapshot import (
    BATCH_KEYS,
    FORMAT_VERSION,
    HEADER_BYTES,
    GroupCapture,
    SnapshotError,
    capture_group,
    decode_segment,
    encode_part,
    materialize,
)
from runtime.errors import StreamRuntimeError

Point = namedtuple("Point", "x y")
DOCUMENTED_HEADER = struct.Struct("<2sBBQQQ")  # as the module's docstring lays it out
RECORD_LENGTH = struct.Struct("<Q")

GROUPS = st.sampled_from([0, 1, 2])
KEYS = st.sampled_from([0, 1, 2, "a", "b", None, (1, "x"), b"k", "\ud800"])
TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["\udfff", "a\ud800b"]))
VALUES = st.one_of(
    st.integers(),
    TEXT,
    st.tuples(st.integers(), TEXT),
    st.lists(st.integers(), max_size=4),
    st.tuples(st.integers(), st.lists(st.integers(), max_size=3)),  # holds a list
    st.integers().map(lambda n: (((((n,),),),),)),  # nested deeper than kept by reference
    st.dictionaries(st.integers(0, 5), st.integers(), max_size=3),
)


def segment(kind: bytes, keys: int, body: bytes, version: int = FORMAT_VERSION) -> bytes:
    """``body`` under a header laid out as the module's docstring documents it."""
    digest = xxhash.xxh3_64_intdigest(body)
    return DOCUMENTED_HEADER.pack(b"KS", version, kind[0], keys, len(body), digest) + body


def records(*pickles: bytes) -> bytes:
    """A body of these records, as documented: each its length, then the pickle."""
    return b"".join(RECORD_LENGTH.pack(len(p)) + p for p in pickles)


def split_records(body: bytes) -> list[object]:
    """The objects a body's records unpickle to."""
    objects, at = [], 0
    while at < len(body):
        (size,) = RECORD_LENGTH.unpack_from(body, at)
        objects.append(pickle.loads(body[at + 8 : at + 8 + size]))
        at += 8 + size
    return objects


def encoded(capture: GroupCapture) -> bytes:
    chunks, index = encode_part({0: capture})
    data = b"".join(chunks)
    assert (index[0].offset, index[0].length) == (0, len(data))
    return data


def assert_same(restored: dict, expected: dict) -> None:
    assert restored == expected
    assert {k: type(v) for k, v in restored.items()} == {k: type(v) for k, v in expected.items()}


class CheckpointingTask(RuleBasedStateMachine):
    """Key groups changed by records and checkpointed; parts written some time after."""

    def __init__(self) -> None:
        super().__init__()
        self.stores: dict[int, dict] = {0: {}, 1: {}, 2: {}}
        self.touched: dict[int, set | None] = dict.fromkeys(self.stores)  # None: untracked
        self.captures: list[dict[int, GroupCapture]] = []  # per checkpoint: group -> capture
        self.expected: list[dict[int, dict]] = []  # per checkpoint: the state when captured
        self.parts: list[dict[int, memoryview]] = []  # per checkpoint written: its segments

    def touch(self, group: int, key: object) -> None:
        if self.touched[group] is not None:
            self.touched[group].add(key)

    @rule(group=GROUPS, key=KEYS, value=VALUES)
    def set_value(self, group: int, key: object, value: object) -> None:
        self.stores[group][key] = value
        self.touch(group, key)

    @rule(group=GROUPS, key=KEYS)
    def clear(self, group: int, key: object) -> None:
        self.stores[group].pop(key, None)
        self.touch(group, key)

    @rule(group=GROUPS, key=KEYS, item=st.integers())
    def change_in_place(self, group: int, key: object, item: int) -> None:
        """What a UDF does with the list or dict ``state.get()`` gave it: no ``set``."""
        value = self.stores[group].get(key)
        if type(value) is tuple and value and type(value[-1]) is list:
            value = value[-1]
        if type(value) is list:
            value.append(item)
        elif type(value) is dict:
            value[item % 7] = item
        self.touch(group, key)  # the record's key, whether its value changed or not

    @rule(group=GROUPS, state=st.dictionaries(KEYS, VALUES, max_size=4))
    def arrive(self, group: int, state: dict) -> None:
        """The group moves in from another task: new state, not tracked yet."""
        self.stores[group] = state
        self.touched[group] = None

    @rule(compacted=st.sets(GROUPS))
    def checkpoint(self, compacted: set[int]) -> None:
        captures = {}
        for group, store in self.stores.items():
            touched = self.touched[group]
            captures[group] = capture_group(
                store, None if touched is None or group in compacted else touched
            )
            self.touched[group] = set()
        self.captures.append(captures)
        self.expected.append(copy.deepcopy(self.stores))

    @rule()
    def write(self) -> None:
        """The background thread writes each checkpoint not written yet, as one part."""
        for captures in self.captures[len(self.parts) :]:
            chunks, index = encode_part(captures)
            assert all(type(chunk) in (bytes, memoryview) for chunk in chunks)
            data = memoryview(b"".join(chunks))
            assert sorted(index) == sorted(captures)
            assert sum(s.length for s in index.values()) == len(data)
            part = {}
            for group, s in index.items():
                assert (s.full, s.keys) == (captures[group].full, captures[group].keys)
                part[group] = data[s.offset : s.offset + s.length]  # a range read
            self.parts.append(part)
        self.check_restores()

    def check_restores(self) -> None:
        """Every checkpoint written rebuilds, per group, from the segments of its chain,
        and from the captures themselves, to the state it was taken at."""
        for n, part in enumerate(self.parts):
            for group in part:
                start = max(i for i in range(n + 1) if self.captures[i][group].full)
                expected = self.expected[n][group]
                assert_same(materialize(p[group] for p in self.parts[start : n + 1]), expected)
                assert_same(materialize(c[group] for c in self.captures[start : n + 1]), expected)

    def teardown(self) -> None:
        self.write()


CheckpointingTask.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, database=None
)
TestCheckpointingTask = CheckpointingTask.TestCase


def exotic_state() -> dict:
    """Values pickle must bring back exactly; built afresh at each call."""
    return {
        None: Point(1, "\udc80"),
        (1, ("nested", (2.5, None))): frozenset({1, "x", (2, 3)}),
        "\ud800 lone": "value \udfff",
        b"bytes key": bytes(range(256)) * 8192,  # 2 MiB
        "counts": defaultdict(list, {"a": [1], "b": []}),
        "deep": ((((((1,),),),),),),
        "holder": (1, [2, 3]),
        "complex": (1 + 2j, -0.0, True),
        "bytearray": bytearray(b"ab"),
        "set": {1, 2},
        "dict": {"x": [1], ("t",): {"y": None}},
        "empty": (),
    }


def change_everything(store: dict) -> None:
    """What UDFs might do to ``exotic_state()`` right after a capture."""
    store["counts"]["a"].append(2)
    store["counts"]["c"]  # a defaultdict grows when read
    store["holder"][1].append(4)
    store["bytearray"][0] = 0
    store["set"].add(3)
    store["dict"]["x"].append(2)
    del store["empty"]
    store["new"] = 1


def test_exotic_values_come_back_exactly_whatever_happens_after_capture():
    store = exotic_state()
    capture = capture_group(store, None)
    change_everything(store)
    big = store[b"bytes key"]
    chunks, _ = encode_part({7: capture})
    assert any(chunk is big for chunk in chunks)  # large bytes are written, not copied
    for restored in (materialize([b"".join(chunks)]), materialize([capture])):
        assert_same(restored, exotic_state())
        assert restored["counts"].default_factory is list
        assert list(restored) == list(exotic_state())


def test_a_delta_keeps_touched_values_and_lists_the_keys_gone():
    store = exotic_state()
    base = capture_group(store, None)
    change_everything(store)
    touched = {"counts", "holder", "empty", "new", "never there"}
    delta = capture_group(store, touched)
    assert not delta.full
    assert set(delta.values) == {"counts", "holder", "new"}
    assert sorted(delta.removed) == ["empty", "never there"]
    store["counts"]["a"].append(3)  # after the delta: not in it
    expected = exotic_state()
    change_everything(expected)
    for chain in ([base, delta], [encoded(base), encoded(delta)]):
        assert_same(
            {k: v for k, v in materialize(chain).items() if k in touched},
            {k: v for k, v in expected.items() if k in touched},
        )


class Text(str):
    """A str subclass: its instances may carry attributes that change."""


def test_immutable_values_are_kept_by_reference_and_the_others_pickled_at_capture():
    immutable = {
        "int": 10**30,
        "float": 1.5,
        "complex": 1j,
        "bool": True,
        "none": None,
        "str": "x",
        "bytes": b"x",
        "tuple": (1, ("a", frozenset({2}))),
        "frozenset": frozenset({(1, 2)}),
        "four deep": ((((1,),),),),
    }
    changeable = {
        "list": [1],
        "dict": {},
        "holds a list": (1, [2]),
        "five deep": (((((1,),),),),),
        "namedtuple": Point(1, 2),
        "str subclass": Text("x"),
        "array": np.arange(3),
    }
    store = immutable | changeable
    for touched in (None, list(store)):
        capture = capture_group(store, touched)
        assert all(capture.values[k] is v for k, v in immutable.items())
        assert all(capture.values[k] is not v for k, v in changeable.items())
        assert capture.keys == len(store)
        assert capture.removed == ()


def test_a_numpy_array_changed_in_place_after_capture_comes_back_as_captured():
    store = {"a": np.arange(5, dtype=np.int64)}
    capture = capture_group(store, None)
    store["a"][0] = 99
    restored = materialize([encoded(capture)])["a"]
    assert restored.dtype == np.int64
    assert restored.tolist() == [0, 1, 2, 3, 4]


def test_materialize_leaves_the_captures_of_its_chain_alone():
    full = capture_group({"a": 1, "c": 3}, None)
    delta = capture_group({"b": [2], "c": 3}, ["a", "b"])
    for chain in ([full, delta], [encoded(full), encoded(delta)]):
        state = materialize(chain)
        assert state == {"b": [2], "c": 3}
        state["b"].append(4)  # the restored task changes its state
        state["d"] = 5
        assert materialize(chain) == {"b": [2], "c": 3}
    assert full.values == {"a": 1, "c": 3}


def test_segments_are_laid_out_as_documented():
    full = capture_group({"a": [1], "b": 2}, None)
    delta = capture_group({"a": 1}, ["a", "gone"])
    chunks, index = encode_part({5: delta, 2: full})
    data = b"".join(chunks)
    assert list(index) == [2, 5]
    assert index[2].offset == 0 and index[5].offset == index[2].length
    for group, kind, removed, values in (
        (2, b"F", (), {"a": [1], "b": 2}),
        (5, b"D", ("gone",), {"a": 1}),
    ):
        s = index[group]
        seg = data[s.offset : s.offset + s.length]
        magic, version, got_kind, keys, size, digest = DOCUMENTED_HEADER.unpack_from(seg)
        assert (magic, version, bytes([got_kind]), keys) == (b"KS", 1, kind, len(values))
        body = seg[HEADER_BYTES:]
        assert (size, digest) == (len(body), xxhash.xxh3_64_intdigest(body))
        assert split_records(body) == [removed, values]
    assert encode_part({}) == ([], {})


def test_a_large_group_is_written_in_batches():
    store = {i: (i, str(i)) for i in range(2 * BATCH_KEYS + 5)}
    store[7] = [7]
    data = encoded(capture_group(store, None))
    removed, *batches = split_records(data[HEADER_BYTES:])
    assert removed == ()
    assert [len(b) for b in batches] == [BATCH_KEYS, BATCH_KEYS, 5]
    assert_same(materialize([data]), store)
    empty = encoded(capture_group({}, ["gone"]))
    assert split_records(empty[HEADER_BYTES:]) == [("gone",)]
    assert decode_segment(empty) == GroupCapture(False, {}, ("gone",))


@pytest.mark.parametrize(
    ("value", "kind"),
    [(lambda: 1, "function"), (threading.Lock(), "_thread.lock"), ([threading.Lock()], "list")],
    ids=["lambda", "lock", "list holding a lock"],
)
@pytest.mark.parametrize("full", [True, False], ids=["full", "delta"])
def test_a_value_that_does_not_pickle_is_named_by_key_and_type(value, kind, full):
    store = {"fine": 1, "the key": value}
    with pytest.raises(SnapshotError, match=f"key 'the key' \\(a {kind}\\)") as caught:
        capture_group(store, None if full else ["fine", "the key"])
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, StreamRuntimeError)


def test_a_long_key_is_shortened_in_the_message():
    with pytest.raises(SnapshotError) as caught:
        capture_group({"k" * 100_000: threading.Lock()}, None)
    assert len(str(caught.value)) < 300


def test_a_capture_whose_keys_do_not_pickle_fails_to_encode_naming_its_group():
    class Local:
        pass

    with pytest.raises(SnapshotError, match="key group 3"):
        encode_part({3: GroupCapture(True, {Local(): 1}, ())})


GOOD = encoded(capture_group({"a": 1, "b": [2]}, None))
REMOVED_NONE = pickle.dumps(())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "fewer than its 28-byte header"),
        (GOOD[:20], "fewer than its 28-byte header"),
        (b"this is not a segment, it is prose", "starts with b'th'"),
        (GOOD[:2] + b"\x09" + GOOD[3:], "format version 9"),
        (GOOD[:3] + b"X" + GOOD[4:], "kind b'X'"),
        (GOOD[:-1], "cut short"),
        (GOOD + b"\0", "too many"),
        (GOOD[:-5] + bytes([GOOD[-5] ^ 1]) + GOOD[-4:], "checksum"),
        (segment(b"F", 0, b""), "does not start with the keys removed"),
        (segment(b"F", 1, records(pickle.dumps({1: 1}))), "does not start with the keys"),
        (segment(b"F", 1, records(REMOVED_NONE, pickle.dumps([1]))), "holds a list, not values"),
        (segment(b"F", 3, records(REMOVED_NONE, pickle.dumps({1: 1}))), "holds 1 keys"),
        (segment(b"F", 1, records(pickle.dumps((2,)), pickle.dumps({1: 1}))), "1 removed"),
        (segment(b"D", 0, records(b"not a pickle")), "do not unpickle"),
        (segment(b"D", 0, RECORD_LENGTH.pack(100) + b"short"), "ends inside a record"),
        (segment(b"D", 0, b"\x01\x02"), "ends inside a record's length"),
    ],
    ids=[
        "empty",
        "header cut",
        "prose",
        "version",
        "kind",
        "truncated",
        "too long",
        "flipped bit",
        "no record",
        "no removed",
        "not values",
        "key count",
        "full with removed",
        "garbage record",
        "record cut",
        "length cut",
    ],
)
def test_data_that_is_not_a_segment_is_refused(data, message):
    with pytest.raises(SnapshotError, match=message):
        decode_segment(data)
    with pytest.raises(SnapshotError, match=message):
        materialize([memoryview(data)])


def test_a_documented_segment_written_by_hand_decodes():
    body = records(pickle.dumps(("gone",)), pickle.dumps({"k": 1}), pickle.dumps({"j": [2]}))
    capture = decode_segment(segment(b"D", 2, body))
    assert capture == GroupCapture(False, {"k": 1, "j": [2]}, ("gone",))


FULL = capture_group({"a": 1}, None)
DELTA = capture_group({"a": 2}, ["a", "b"])


@pytest.mark.parametrize(
    ("chain", "message"),
    [
        ([], "empty"),
        ([DELTA, FULL], "starts with a delta of 1 keys written and 1 removed"),
        ([encoded(DELTA)], "starts with a delta"),
        ([FULL, DELTA, FULL], "a full capture of 1 keys at position 2"),
        ([encoded(FULL), encoded(FULL)], "at position 1"),
    ],
    ids=["empty", "delta first", "encoded delta first", "full later", "encoded full later"],
)
def test_a_chain_must_start_with_its_only_full_capture(chain, message):
    with pytest.raises(SnapshotError, match=message):
        materialize(chain)
