"""Frames parsed in place (``FrameReader``): however the bytes are cut, the same frames
and payloads come out, in order; bad lengths are refused naming the peer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime import protocol
from runtime.dataserver import _state_payload  # the data server's rule: what follows a frame

values = st.one_of(st.integers(-(2**40), 2**40), st.text(max_size=20), st.binary(max_size=40))
data_frames = st.tuples(
    st.just(protocol.DATA), st.text(max_size=12), st.lists(values, max_size=30).map(tuple)
)
state_frames = st.builds(
    lambda rid, part, payload: ((protocol.STATE, rid, "count-0", part, 0, 1, True), payload),
    st.integers(1, 99),
    st.integers(0, 127),
    st.binary(max_size=300_000),
)


def wire(items: list) -> bytes:
    out = bytearray()
    for item in items:
        if isinstance(item[1], bytes):  # a state frame and its payload
            head, payload = item
            out += protocol.encode([*head, len(payload)]) + payload
        else:
            out += protocol.encode(list(item))
    return bytes(out)


def expected(items: list) -> list:
    got = []
    for item in items:
        if isinstance(item[1], bytes):
            head, payload = item
            got.append(((*head, len(payload)), payload))
        else:
            got.append((tuple(item), None))
    return got


def feed(
    reader: protocol.FrameReader,
    data: bytes,
    cuts: list[int],
    pool: protocol.PayloadPool | None = None,
) -> list:
    """Hand ``data`` to ``reader`` the way a socket would: at most ``cuts[i]`` bytes (and
    at most what its buffer offers) per read. Each payload is read at once and, with a
    ``pool``, its buffer given back for the next one."""
    out, pos, i = [], 0, 0
    while pos < len(data):
        room = reader.buffer()
        n = min(len(room), cuts[i % len(cuts)], len(data) - pos)
        room[:n] = data[pos : pos + n]
        room.release()
        for f, p in reader.received(n):
            out.append((f, None if p is None else bytes(p)))
            if pool is not None:
                pool.give(p)
        pos, i = pos + n, i + 1
    return out


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(st.one_of(data_frames, state_frames), max_size=12),
    cuts=st.lists(st.integers(1, 200_000), min_size=1, max_size=8),
)
def test_frames_come_out_whole_and_in_order_however_the_bytes_are_cut(
    items: list, cuts: list[int]
) -> None:
    reader = protocol.FrameReader("worker w9", _state_payload)
    assert feed(reader, wire(items), cuts) == expected(items)
    # The same with payloads received into buffers that are reused once read.
    pool = protocol.PayloadPool()
    reader = protocol.FrameReader("worker w9", _state_payload, pool)
    assert feed(reader, wire(items), cuts, pool) == expected(items)


def test_a_payload_buffer_given_back_takes_the_next_payload_of_its_size() -> None:
    pool = protocol.PayloadPool()
    first = pool.take(1_500_000)
    assert isinstance(first, memoryview) and first.nbytes == 1_500_000
    buf = first.obj
    assert len(buf) == 1 << 21  # the next power of two
    pool.give(first)
    with pytest.raises(ValueError):
        first.tobytes()  # the giver's view is released: it cannot read the reused buffer
    pool.give(first)  # given back twice: nothing happens
    again = pool.take(1_200_000)
    assert again.obj is buf and again.nbytes == 1_200_000
    assert pool.take(1_200_000).obj is not buf  # taken: the next one is new
    # Small payloads are plain bytearrays, never pooled; foreign objects are ignored.
    small = pool.take(100)
    assert type(small) is bytearray and len(small) == 100
    pool.give(small)
    pool.give(b"x" * 100_000)
    pool.give(memoryview(bytearray(100_000)))  # not a power of two: not from the pool
    assert len(pool.take(100_000).obj) == 1 << 17  # a new buffer, not the foreign one
    # At most KEEP free buffers of a size are kept.
    views = [pool.take(1 << 20) for _ in range(pool.KEEP + 2)]
    bufs = [v.obj for v in views]  # held here, so that no new buffer can take their place
    for v in views:
        pool.give(v)
    again = [pool.take(1 << 20).obj for _ in range(pool.KEEP + 1)]
    assert sum(any(b is a for a in bufs) for b in again) == pool.KEEP


def test_a_frame_larger_than_the_buffer_grows_it() -> None:
    big = (protocol.DATA, "j/a>b", ("x" * 1000,) * 2000)
    reader = protocol.FrameReader("worker w9", _state_payload)
    assert feed(reader, protocol.encode(list(big)), [65536]) == [(big, None)]


@pytest.mark.parametrize(
    ("frame", "fragment"),
    [
        (b"\xff\xff\xff\xff", "exceeds the"),
        (b"\x00\x00\x00\x03\xc1\xc1\xc1", "does not decode"),
        (protocol.encode([protocol.STATE, 1, "count-0", 3, 0, 1, True, -5]), "-5 bytes"),
        (protocol.encode([protocol.STATE, 1, "count-0", 3, 0, 1, True, "x"]), "'x' bytes"),
    ],
    ids=["oversize", "garbage", "negative-payload", "payload-length-not-int"],
)
def test_bad_frames_are_refused_naming_the_peer(frame: bytes, fragment: str) -> None:
    reader = protocol.FrameReader("worker w9", _state_payload)
    with pytest.raises(protocol.FrameError, match="worker w9") as err:
        feed(reader, frame, [1 << 20])
    assert fragment in str(err.value)
