"""The msgpack codec: native values round trip (arrays decode as tuples), other objects
travel pickled, and bad input or unencodable objects raise CodecError."""

from __future__ import annotations

import threading

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jobs_for_tests import Account, Point, Trade, identity

from runtime.codec import CodecError, packb, unpackb


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -1,
        2**64 - 1,
        -(2**63),
        1.5,
        float("inf"),
        "",
        "naïve 日本 \U0001f600",
        b"",
        b"\x00\xff",
        (),
        (1, "a", (None, 2.5)),
        {},
        {"a": 1, 2: "b", b"c": None, (1, 2): (3,)},
    ],
)
def test_native_values_round_trip(value: object) -> None:
    back = unpackb(packb(value))
    assert back == value
    assert type(back) is type(value)


def test_arrays_decode_as_tuples() -> None:
    """Documented: lists come back as tuples (records stay hashable), at any depth."""
    assert unpackb(packb([1, [2, 3], {"xs": [4]}])) == (1, (2, 3), {"xs": (4,)})
    assert unpackb(packb(((1, 2), [3]))) == ((1, 2), (3,))


def test_tuple_dict_keys_stay_hashable() -> None:
    assert unpackb(packb({(1, ("a", 2)): "v"})) == {(1, ("a", 2)): "v"}


def test_ints_beyond_64_bits_travel_pickled() -> None:
    for n in (2**64, -(2**63) - 1, 10**40):
        assert unpackb(packb(n)) == n
        assert unpackb(packb([n]))[0] == n


@pytest.mark.parametrize(
    "value",
    [
        {1, 2},
        frozenset({"a"}),
        Point(1.0, 2.0),
        Account("ann", 5, [1, 2]),
        complex(1, 2),
        identity,
        ("mixed", {3}, Point(0.0, 0.0)),
    ],
)
def test_other_objects_travel_pickled(value: object) -> None:
    back = unpackb(packb(value))
    assert back == value
    assert type(back) is type(value)


def test_pickled_dataclass_keeps_its_lists() -> None:
    back = unpackb(packb(Account("ann", 5, [1, 2])))
    assert back.history == [1, 2]


def test_namedtuple_records_keep_their_type() -> None:
    back = unpackb(packb(Trade("X", 1.5)))
    assert back.price == 1.5


def test_lone_surrogate_strings_round_trip() -> None:
    assert unpackb(packb("\udc80")) == "\udc80"


@pytest.mark.parametrize(
    ("frame", "fragment"),
    [
        (b"", "frame of 0 bytes does not decode"),
        (b"\xc1", "frame of 1 bytes does not decode"),  # a reserved msgpack byte
        (b"\x92\x01", "frame of 2 bytes does not decode"),  # an array cut short
        (b"\x01\x02", "frame of 2 bytes does not decode"),  # extra data
        (b"\xc7\x03\x01abc", "frame of 6 bytes does not decode"),  # pickle ext, not a pickle
        (b"\xc7\x01\x05a", "unknown msgpack extension type 5"),
    ],
)
def test_garbage_bytes_raise_codec_error(frame: bytes, fragment: str) -> None:
    with pytest.raises(CodecError) as info:
        unpackb(frame)
    assert fragment in str(info.value)


@pytest.mark.parametrize("value", [threading.Lock(), [1, threading.Lock()], lambda: 1])
def test_unpicklable_objects_raise_codec_error(value: object) -> None:
    with pytest.raises(CodecError, match="cannot encode"):
        packb(value)


def test_a_recursive_list_raises_codec_error() -> None:
    loop: list = []
    loop.append(loop)
    with pytest.raises(CodecError, match="cannot encode list"):
        packb(loop)


def test_codec_error_is_a_value_error() -> None:
    assert issubclass(CodecError, ValueError)


def test_frames_are_plain_msgpack_for_native_values() -> None:
    assert packb({"a": (1, b"x")}) == msgpack.packb({"a": [1, b"x"]}, use_bin_type=True)


def as_decoded(value: object) -> object:
    """What ``unpackb(packb(value))`` should be: lists become tuples, recursively."""
    if isinstance(value, list | tuple):
        return tuple(as_decoded(v) for v in value)
    if isinstance(value, dict):
        return {as_decoded(k): as_decoded(v) for k, v in value.items()}
    return value


native = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(allow_nan=False),
        st.text(),
        st.binary(max_size=16),
    ),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(native)
def test_any_native_value_round_trips_with_lists_as_tuples(value: object) -> None:
    assert unpackb(packb(value)) == as_decoded(value)
