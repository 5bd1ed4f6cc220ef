"""The pre-copy format (runtime.precopy): a copy ahead plus the delta of the keys touched
since always gives the state as it is at the delta, whatever happened in between."""

from __future__ import annotations

import asyncio
import pickle
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime import handshake, precopy, protocol
from runtime.dataserver import DataServer
from runtime.handover import STATE_CHUNK_BYTES, StateInbox, send_state, ships_within
from runtime.peerlink import PeerLink

keys = st.one_of(st.integers(-50, 50), st.text(max_size=8), st.binary(min_size=300, max_size=400))
leaves = st.one_of(
    st.integers(),
    st.text(max_size=600),
    st.binary(max_size=700),
    st.lists(st.integers(), max_size=4),
)
values = st.one_of(
    leaves,
    st.tuples(st.integers(), leaves),
    st.dictionaries(st.text(max_size=3), leaves, max_size=3),
)
# What a record may do to the state of its key after the copy: set a new value, set a
# value sharing the old one's parts, change a list or dict in place, or clear it.
edits = st.lists(
    st.tuples(keys, st.sampled_from(["set", "reuse", "in place", "clear"]), values), max_size=30
)


def apply_edits(store: dict, batch: list) -> set:
    touched = set()
    for key, how, value in batch:
        touched.add(key)
        old = store.get(key)
        if how == "set":
            store[key] = value
        elif how == "reuse" and old is not None:
            store[key] = (len(touched), old)  # a new tuple around the very same object
        elif how == "in place" and isinstance(old, list):
            old.append(len(touched))
        elif how == "in place" and isinstance(old, dict):
            old["x"] = value
        elif how == "in place" and isinstance(old, tuple) and isinstance(old[1], list):
            old[1].append(0)
        elif how == "clear":
            store.pop(key, None)
    return touched


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, values, max_size=20), edits, edits)
def test_a_copy_ahead_and_its_delta_give_the_state_as_it_is_at_the_delta(
    initial: dict, before: list, after: list
) -> None:
    store = pickle.loads(pickle.dumps(initial))
    apply_edits(store, before)  # as it ran before the copy
    data, memo = precopy.export_base(store)
    base = b"".join(data)
    touched = apply_edits(store, after)  # as it ran between the copy and the update
    delta = precopy.export_delta(store, touched, memo)
    got, their_memo = precopy.load_base(base)
    assert precopy.apply_delta(got, their_memo, delta) == store


def test_an_unchanged_large_object_is_not_sent_again() -> None:
    """A value ``(count, payload)`` whose count moves on while its payload stays the same
    object: the delta refers to the payload the copy already holds."""
    store = {f"word{i}": (i, bytes(20_000)) for i in range(50)}
    data, memo = precopy.export_base(store)
    got, their_memo = precopy.load_base(b"".join(data))
    for i in range(50):
        store[f"word{i}"] = (i + 1, store[f"word{i}"][1])
    delta = precopy.export_delta(store, set(store), memo)
    assert len(delta) < 2_000 < len(b"".join(data)) // 100
    after = precopy.apply_delta(got, their_memo, delta)
    assert after == store
    assert after["word7"][1] is got["word7"][1]  # the object that came with the copy


def test_a_changed_mutable_value_is_sent_whole_even_when_it_is_the_same_object() -> None:
    store = {"k": ["x" * 1000]}
    data, memo = precopy.export_base(store)
    got, their_memo = precopy.load_base(b"".join(data))
    store["k"].append("y" * 1000)
    after = precopy.apply_delta(got, their_memo, precopy.export_delta(store, {"k"}, memo))
    assert after == {"k": ["x" * 1000, "y" * 1000]}


def test_the_inbox_puts_a_copy_and_its_delta_together_and_drops_them_on_abort() -> None:
    inbox = StateInbox()
    store = {"a": (1, b"p" * 1000), "b": (2, b"q" * 1000)}
    data, memo = precopy.export_base(store)
    inbox.put(7, "count-1", precopy.part_name("base", 3), b"".join(data))
    store["a"] = (5, store["a"][1])
    del store["b"]
    inbox.put(
        7, "count-1", precopy.part_name("delta", 3), precopy.export_delta(store, {"a", "b"}, memo)
    )
    assert inbox._parts[(7, "count-1")] == {3: {"a": (5, b"p" * 1000)}}
    # A delta without its copy is an error the task's update raises, naming the group.
    inbox.put(7, "count-1", precopy.part_name("delta", 4), b"")
    error = inbox._parts[(7, "count-1")][4]
    assert isinstance(error, ValueError) and "key group 4" in str(error)
    # Aborted: what came is dropped, and so is what comes later.
    inbox.put(8, "count-1", precopy.part_name("base", 3), b"".join(data))
    inbox.drop(8)
    inbox.put(8, "count-1", precopy.part_name("delta", 3), b"")
    assert not any(k[0] == 8 for k in inbox._parts) and not inbox._bases and not inbox._unread


def test_copies_ahead_are_read_only_once_the_tasks_have_caught_up() -> None:
    """Reading a copy costs the receiving worker's loop what pickling it cost the sender:
    it waits for the tasks there to have no input waiting. A delta that comes first reads
    its copy itself."""

    async def main() -> None:
        inbox = StateInbox()
        idle = asyncio.Event()

        async def caught_up() -> None:
            await idle.wait()

        reader = asyncio.create_task(inbox.read_copies(caught_up))
        try:
            for g in (1, 2):
                data, memo = precopy.export_base({"k": g})
                inbox.put(3, "count-0", precopy.part_name("base", g), b"".join(data))
            for _ in range(10):  # turns of the loop (no time): the reader runs until it waits
                await asyncio.sleep(0)
            assert len(inbox._unread) == 2 and not inbox._bases  # the tasks are busy
            delta = precopy.export_delta({"k": 20}, {"k"}, memo)
            inbox.put(3, "count-0", precopy.part_name("delta", 2), delta)
            assert inbox._parts[(3, "count-0")] == {2: {"k": 20}}
            idle.set()
            for _ in range(10):  # turns of the loop (no time): the reader reads the copy
                await asyncio.sleep(0)
            assert not inbox._unread and list(inbox._bases) == [(3, "count-0", 1)]
        finally:
            reader.cancel()

    asyncio.run(main())


def received(pool: protocol.PayloadPool, data: bytes | memoryview) -> memoryview:
    """``data`` as the data server hands it over: in a buffer taken from ``pool``."""
    buf = pool.take(len(data))
    assert isinstance(buf, memoryview)  # large enough to be pooled
    buf[:] = data
    return buf


def test_a_copy_that_comes_while_the_tasks_are_idle_is_read_at_once_and_its_buffer_reused() -> None:
    """The buffer a copy came in takes the next copy once read: what was read from it
    stays as it was, and the delta applies to it."""
    pool = protocol.PayloadPool()
    idle = [True]
    inbox = StateInbox(pool, idle=lambda: idle[0])
    stores = {g: {f"w{g}-{i}": (i, bytes([g]) * 5_000) for i in range(40)} for g in (1, 2, 3)}
    memos = {}
    for g in (1, 2):
        data, memos[g] = precopy.export_base(stores[g])
        chunk = received(pool, b"".join(data))
        buffer = chunk.obj
        inbox.put(5, "count-1", precopy.part_name("base", g), chunk)
        assert not inbox._unread  # read at once: the tasks had nothing waiting
        if g == 1:
            first = buffer
    assert buffer is first  # the second copy came in the first one's buffer
    # Busy: the third waits for the tasks to catch up (read_copies), its buffer held.
    idle[0] = False
    data, memos[3] = precopy.export_base(stores[3])
    inbox.put(5, "count-1", precopy.part_name("base", 3), received(pool, b"".join(data)))
    assert list(inbox._unread) == [(5, "count-1", 3)]
    assert pool.take(len(b"".join(data))).obj is not first  # in use: not handed out again
    for g in (1, 2, 3):
        stores[g][f"w{g}-0"] = (100, stores[g][f"w{g}-0"][1])
        delta = precopy.export_delta(stores[g], {f"w{g}-0"}, memos[g])
        inbox.put(
            5,
            "count-1",
            precopy.part_name("delta", g),
            received(pool, delta + bytes(70_000))[: len(delta)],
        )
    assert inbox._parts[(5, "count-1")] == stores


@pytest.mark.parametrize(
    ("left", "pause_s", "sent", "sending_s", "read", "reading_s", "ships"),
    [
        (8 << 20, 0.02, 4 << 20, 0.008, 0, 0.0, True),  # 16 ms at the sender's pace alone
        (8 << 20, 0.02, 4 << 20, 0.008, 2 << 20, 0.008, False),  # + 32 ms to read: 48 ms
        (8 << 20, 0.05, 4 << 20, 0.008, 2 << 20, 0.008, True),
        (0, 0.0, 0, 0.0, 0, 0.0, True),  # nothing left
        (1, 1.0, 0, 0.0, 0, 0.0, False),  # no pace measured yet: go on copying
    ],
)
def test_the_rest_ships_within_a_pause_at_both_ends_pace(
    left: int, pause_s: float, sent: int, sending_s: float, read: int, reading_s: float, ships: bool
) -> None:
    assert ships_within(left, pause_s, sent, sending_s, read, reading_s) is ships


@given(
    left=st.integers(0, 1 << 30),
    more=st.integers(0, 1 << 30),
    pause_s=st.floats(0, 10),
    sent=st.integers(1, 1 << 30),
    sending_s=st.floats(0, 10),
    read=st.integers(0, 1 << 30),
    reading_s=st.floats(0, 10),
)
def test_more_left_or_a_slower_receiver_never_ships_sooner(
    left: int,
    more: int,
    pause_s: float,
    sent: int,
    sending_s: float,
    read: int,
    reading_s: float,
) -> None:
    ships = ships_within(left, pause_s, sent, sending_s, read, reading_s)
    if ships_within(left + more, pause_s, sent, sending_s, read, reading_s):
        assert ships
    if read and ships_within(left, pause_s, sent, sending_s, read, reading_s + 1.0):
        assert ships
    if ships:
        assert ships_within(left, pause_s, sent, sending_s, 0, 0.0)  # the sender alone


def test_a_sender_has_room_for_copies_ahead_as_the_receiver_reads_them() -> None:
    """Over a real loopback link: copies a busy receiver has not read hold the next one
    back (for at most the wait given), each copy read, or dropped with its aborted
    reconfiguration, makes room again, and one that comes after the abort is let go at once.
    The sender learns the bytes read and the seconds reading them took (none for a copy
    dropped unread)."""

    async def main() -> None:
        inbox = StateInbox(idle=lambda: False)  # the receiver's tasks are busy
        server = DataServer("secret", {}, on_state=lambda job, *chunk: inbox.put_frame(*chunk))
        host, port = await server.start("127.0.0.1")
        key = handshake.data_key("secret", "job-1")
        link = await PeerLink.connect("w2", host, port, "w1", job_id="job-1", key=key)
        permits: asyncio.Queue[None] = asyncio.Queue()  # one idle moment each
        reader = asyncio.create_task(inbox.read_copies(permits.get))

        async def send_copy(rid: int, g: int) -> int:
            data, _memo = precopy.export_base({f"k{g}": (g, b"x" * 2000)})
            await send_state(link, rid, "count-1", precopy.part_name("base", g), data, raw=True)
            nbytes = sum(map(len, data))
            link.copy_sent(rid, nbytes)
            return nbytes

        try:
            sizes = [await send_copy(7, g) for g in (1, 2)]
            t0 = time.perf_counter()
            assert await link.copy_room(7, 2, 0.2) is False
            assert time.perf_counter() - t0 >= 0.2 and link.copies_unread == {7: 2}
            assert len(inbox._unread) == 2
            assert await link.copy_room(8, 2, 0.2) is True  # another change's copies
            permits.put_nowait(None)  # one idle moment: one copy read, room for one
            assert await link.copy_room(7, 2, 5.0) is True
            assert link.copies_unread == {7: 1} and len(inbox._unread) == 1
            read, seconds = link.copies_read(7)
            assert read == sizes[0] and seconds > 0  # the first copy, and its reading
            inbox.drop(7)  # aborted: the copy left unread makes room too
            assert await link.copy_room(7, 1, 5.0) is True and link.copies_unread == {}
            assert link.copies_read(7) == (sum(sizes), seconds)  # dropped: no time
            link.forget_copies(7)
            assert link.copies_read(7) == (0, 0.0)
            await send_copy(7, 3)  # late: dropped as it comes, and said so
            assert await link.copy_room(7, 1, 5.0) is True and link.copies_unread == {}
            assert not inbox._unread and not inbox._bases
        finally:
            reader.cancel()
            await link.close()
            await server.close()

    asyncio.run(main())


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(0, 3 * STATE_CHUNK_BYTES // 2), min_size=1, max_size=5))
def test_a_payload_in_pieces_arrives_as_their_concatenation(sizes: list[int]) -> None:
    """``send_state`` takes a list of pieces (as :func:`precopy.export_base` gives them)
    and sends them as one payload in chunks of at most ``STATE_CHUNK_BYTES``, over a real
    loopback link, whatever the pieces' sizes against the chunks'."""
    pieces = [bytes([i + 1]) * n for i, n in enumerate(sizes)]

    async def main() -> bytes:
        got: list[tuple[tuple, bytes]] = []
        done = asyncio.Event()

        def on_state(frame: tuple, payload: bytearray | memoryview, read) -> None:
            got.append((frame, bytes(payload)))
            if frame[4] == frame[5] - 1:
                done.set()

        server = DataServer("secret", {}, on_state=lambda job, *chunk: on_state(*chunk))
        host, port = await server.start("127.0.0.1")
        key = handshake.data_key("secret", "job-1")
        link = await PeerLink.connect("w2", host, port, "w1", job_id="job-1", key=key)
        try:
            await send_state(link, 3, "count-1", "base:1", pieces, raw=True)
            await asyncio.wait_for(done.wait(), 10)
        finally:
            await link.close()
            await server.close()
        assert [f[4] for f, _ in got] == list(range(len(got)))  # in order, none missing
        assert all(len(p) <= STATE_CHUNK_BYTES for _, p in got)
        assert all(len(p) == STATE_CHUNK_BYTES for _, p in got[:-1])
        return b"".join(p for _, p in got)

    assert asyncio.run(main()) == b"".join(pieces)


def test_a_large_mutable_value_is_copied_so_that_its_task_may_resize_it_while_it_is_sent() -> None:
    """The pickler hands a large ``bytearray`` over as itself: the copy must not hold the
    task's object, or resizing it while the copy is sent would fail in the task."""
    value = bytearray(b"a" * 200_000)
    big = b"b" * 200_000
    pieces, _memo = precopy.export_base({"k": value, "s": (1, big)})
    views = [memoryview(piece) for piece in pieces]  # as send_state holds them
    value.extend(b"c" * 1_000)  # would raise BufferError if a piece were ``value``
    value[:3] = b"xyz"
    del views
    got, _their_memo = precopy.load_base(pieces)
    assert got == {"k": bytearray(b"a" * 200_000), "s": (1, big)}
    assert any(piece is big for piece in pieces)  # an immutable value goes without a copy


def test_payloads_go_out_of_band_as_they_are_and_the_delta_refers_to_them() -> None:
    """A group whose values hold large objects is copied with them after the pickle as
    they are (``bytes`` not copied, ``str`` encoded), whatever their size against the
    pickler's frames; the delta names them, a ``str`` included, by their place."""
    payloads = [bytes([i]) * 21_000 for i in range(30)]
    text = "é" * 300 + "\udcff"  # its out-of-band bytes are its UTF-8, a lone surrogate too
    store = {f"w{i}": (i, p) for i, p in enumerate(payloads)} | {"t": (0, text)}
    pieces, shared = precopy.export_base(store)
    assert pieces[0][:1] == b"O" and shared is not None
    assert all(any(piece is p for piece in pieces) for p in payloads)
    got, objects = precopy.load_base(b"".join(pieces))
    assert got == store and got["t"][1] == text
    came = {k: got[k][1] for k in ("w3", "t")}  # the objects the copy brought
    store["w3"] = (99, store["w3"][1])
    store["t"] = (1, text)
    store["new"] = (1, b"n" * 1_000)  # not in the copy: goes in the delta whole
    delta = precopy.export_delta(store, {"w3", "t", "new"}, shared)
    assert len(delta) < 1_000 + 200
    after = precopy.apply_delta(got, objects, delta)
    assert after == store
    assert after["w3"][1] is came["w3"] and after["t"][1] is came["t"]


def test_a_group_of_small_values_is_copied_plainly() -> None:
    """Referring would cost a call per object for nothing to share: copy and delta are
    plain pickles."""
    store = {i: (i, "x" * 10) for i in range(1_000)}
    pieces, shared = precopy.export_base(store)
    assert pieces[0] == b"P" and shared is None
    got, objects = precopy.load_base(pieces)
    store[5] = (6, "y")
    delta = precopy.export_delta(store, {5}, shared)
    assert delta[:1] == b"P"
    assert precopy.apply_delta(got, objects, delta) == store


@pytest.mark.parametrize(
    "mangle, says",
    [
        (lambda b: b[: len(b) - 30_000], "shorter than the objects it lists"),
        (lambda b: b"X" + b[1:], "starts with b'X'"),
    ],
)
def test_a_damaged_copy_is_refused_with_a_reason(mangle, says: str) -> None:
    store = {f"w{i}": (i, bytes(10_000)) for i in range(5)}
    pieces, _shared = precopy.export_base(store)
    with pytest.raises(ValueError, match=says):
        precopy.load_base(mangle(b"".join(pieces)))
