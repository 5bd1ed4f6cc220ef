"""Routing and batching of a task's output: each edge sends every record where its
partitioning says, and Outputs delivers them in order, in batches of at most batch_size.

Channels here are a real :class:`OutputChannel` subclass that records what it delivers
instead of handing it to a receiver; credits, buffers and batching are the real ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jobs_for_tests import first

from runtime.channels import OutputChannel
from runtime.keygroups import KeyGroupHasher, key_group
from runtime.partitioning import (
    BroadcastEdge,
    Edge,
    ForwardEdge,
    KeyGroupEdge,
    Outputs,
    RebalanceEdge,
)
from runtime.records import Barrier, BarrierKind, EndOfStream

HOUR = 3600.0  # a linger that never passes during a test


class RecordingChannel(OutputChannel):
    """Delivers into a log: ("batch", values, stamps) and ("control", item), in order."""

    def __init__(self, key: str, credits: int = 1_000_000) -> None:
        super().__init__(key, key, credits)
        self.log: list[tuple] = []

    def _deliver_batch(self, values: list, stamps: list) -> None:
        self.log.append(("batch", values, stamps))

    def _deliver_control(self, item: Barrier | EndOfStream) -> None:
        self.log.append(("control", item))

    def batches(self) -> list[list]:
        return [entry[1] for entry in self.log if entry[0] == "batch"]

    def delivered(self) -> list:
        return [v for batch in self.batches() for v in batch]

    def delivered_stamps(self) -> list[float]:
        return [t for entry in self.log if entry[0] == "batch" for t in entry[2]]


def channels(n: int, prefix: str = "down") -> list[RecordingChannel]:
    return [RecordingChannel(f"{prefix}-{i}") for i in range(n)]


def records(keys: Sequence) -> tuple[list[tuple], list[float]]:
    """Records ``(key, i)`` with stamps ``i`` (so a stamp tells which record it belongs to)."""
    return [(k, i) for i, k in enumerate(keys)], [float(i) for i in range(len(keys))]


def run(coro_fn) -> None:
    asyncio.run(coro_fn())


async def turns(n: int = 10) -> None:
    """Let the event loop run ``n`` turns (no time passes): other tasks run until they wait."""
    for _ in range(n):
        await asyncio.sleep(0)


# ---------------------------------------------------------------- forward, broadcast


def test_forward_edge_sends_everything_to_its_channel_in_order() -> None:
    chs = channels(1)
    values, stamps = records("abcde")
    edge = ForwardEdge("next", chs)
    edge.route(values[:2], stamps[:2])
    edge.route(values[2:], stamps[2:])
    assert chs[0].buf_v == values and chs[0].buf_t == stamps


def test_broadcast_edge_sends_everything_to_every_channel() -> None:
    chs = channels(3)
    values, stamps = records("abc")
    BroadcastEdge("next", chs).route(values, stamps)
    for ch in chs:
        assert ch.buf_v == values and ch.buf_t == stamps


def test_edge_base_class_does_not_route() -> None:
    with pytest.raises(NotImplementedError):
        Edge("next", channels(1)).route([1], [0.0])


# ---------------------------------------------------------------- key groups

route_keys = st.lists(st.one_of(st.text(max_size=6), st.integers(-1000, 1000)), max_size=80)


@st.composite
def owner_tables(draw: st.DrawFn) -> tuple[int, int, list[int]]:
    n_channels = draw(st.integers(1, 6))
    max_parallelism = draw(st.integers(1, 64))
    owner = draw(
        st.lists(st.integers(0, n_channels - 1), min_size=max_parallelism, max_size=max_parallelism)
    )
    return n_channels, max_parallelism, owner


@settings(max_examples=150, deadline=None)
@given(owner_tables(), route_keys)
def test_key_group_edge_routes_each_record_to_its_owner(table, keys) -> None:
    n_channels, max_parallelism, owner = table
    chs = channels(n_channels)
    edge = KeyGroupEdge("count", chs, first, KeyGroupHasher(max_parallelism), owner)
    values, stamps = records(keys)
    half = len(values) // 2
    edge.route(values[:half], stamps[:half])
    edge.route(values[half:], stamps[half:])
    for index, ch in enumerate(chs):
        expected = [v for v in values if owner[key_group(v[0], max_parallelism)] == index]
        assert ch.buf_v == expected
        assert ch.buf_t == [float(v[1]) for v in expected]


def test_set_owner_swaps_routing_and_keeps_the_buffers() -> None:
    chs = channels(2)
    mp = 8
    edge = KeyGroupEdge("count", chs, first, KeyGroupHasher(mp), [0] * mp)
    buffers = [(ch.buf_v, ch.buf_t) for ch in chs]
    keys = [f"k{i}" for i in range(40)]
    values, stamps = records(keys)
    edge.route(values, stamps)
    assert chs[0].buf_v == values and chs[1].buf_v == []

    moved = {key_group(k, mp) for k in keys[:5]}
    owner = [1 if g in moved else 0 for g in range(mp)]
    edge.set_owner(owner)
    assert edge.owner == owner
    edge.route(values, stamps)
    assert chs[1].buf_v == [v for v in values if key_group(v[0], mp) in moved]
    assert chs[0].buf_v == values + [v for v in values if key_group(v[0], mp) not in moved]
    # Outputs and the edges share these lists: set_owner must not replace them.
    assert all(ch.buf_v is v and ch.buf_t is t for ch, (v, t) in zip(chs, buffers, strict=True))


@pytest.mark.parametrize(
    ("owner", "fragment"),
    [
        ([0, 2, 1, 5], r"key groups \[1, 3\] have no owner"),
        ([0, -1, 0, 0], r"key groups \[1\] have no owner"),
    ],
)
def test_bad_owner_table_is_refused(owner: list[int], fragment: str) -> None:
    chs = channels(2)
    with pytest.raises(ValueError, match=rf"edge to 'count': {fragment}"):
        KeyGroupEdge("count", chs, first, KeyGroupHasher(4), owner)
    edge = KeyGroupEdge("count", chs, first, KeyGroupHasher(4), [0, 0, 1, 1])
    with pytest.raises(ValueError, match=fragment):
        edge.set_owner(owner)
    assert edge.owner == [0, 0, 1, 1]  # the old table stays in force


@pytest.mark.parametrize("length", [2, 6])
def test_owner_table_of_the_wrong_length_is_refused(length: int) -> None:
    with pytest.raises(ValueError):
        KeyGroupEdge("count", channels(2), first, KeyGroupHasher(4), [0] * length)


# ---------------------------------------------------------------- rebalance


def test_rebalance_with_equal_weights_is_round_robin() -> None:
    chs = channels(3)
    edge = RebalanceEdge("next", chs)
    for b in range(7):
        edge.route([b], [0.0])
    assert [ch.buf_v for ch in chs] == [[0, 3, 6], [1, 4], [2, 5]]


weights = st.lists(st.floats(0, 10) | st.integers(0, 5), min_size=1, max_size=6).filter(
    lambda ws: sum(ws) > 0
)


@settings(max_examples=150, deadline=None)
@given(weights, st.integers(1, 300))
def test_rebalance_spreads_whole_batches_in_proportion_to_weights(ws, n_batches) -> None:
    """After every batch, a channel is never a whole batch ahead of its share, and lags
    it by less than ``channels - 1`` batches. (Smooth weighted round-robin keeps each
    current weight above ``-total``; they sum to 0. The lag can exceed one batch: weights
    [10, 10, 10, 2.25, 0.5] leave the third channel 1.02 batches behind after 23.)"""
    chs = channels(len(ws))
    edge = RebalanceEdge("next", chs, ws)
    total = sum(ws)
    for b in range(1, n_batches + 1):
        edge.route([b, b], [0.0, 0.0])  # a batch of two: it must stay whole
        for ch, w in zip(chs, ws, strict=True):
            ahead = len(ch.buf_v) / 2 - b * w / total
            assert -(len(ws) - 1) - 1e-9 <= ahead < 1 + 1e-9
    for ch, w in zip(chs, ws, strict=True):
        assert ch.buf_v[::2] == ch.buf_v[1::2]
        if w == 0:
            assert ch.buf_v == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=6).filter(any), st.integers(1, 4))
def test_rebalance_with_integer_weights_is_exact_every_period(ws, periods) -> None:
    """With integer weights, every ``sum(weights)`` batches send exactly ``w`` to each."""
    chs = channels(len(ws))
    edge = RebalanceEdge("next", chs, ws)
    for p in range(1, periods + 1):
        for _ in range(sum(ws)):
            edge.route([p], [0.0])
        assert [len(ch.buf_v) for ch in chs] == [p * w for w in ws]


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 10), st.floats(0, 10).filter(lambda w: w > 0), st.integers(1, 300))
def test_rebalance_over_two_channels_is_within_one_batch(w0, w1, n_batches) -> None:
    chs = channels(2)
    edge = RebalanceEdge("next", chs, [w0, w1])
    for b in range(1, n_batches + 1):
        edge.route([b], [0.0])
        for ch, w in zip(chs, (w0, w1), strict=True):
            assert abs(len(ch.buf_v) - b * w / (w0 + w1)) < 1 + 1e-9


def test_set_weights_restarts_the_rotation() -> None:
    chs = channels(2)
    edge = RebalanceEdge("next", chs)
    edge.set_weights([0, 1])
    for b in range(4):
        edge.route([b], [0.0])
    assert chs[1].buf_v == [0, 1, 2, 3]


@pytest.mark.parametrize("ws", [[1.0], [1.0, 1.0, 1.0], [1.0, -1.0], [0, 0], [0.0, -0.0]])
def test_bad_weights_are_refused(ws: list[float]) -> None:
    with pytest.raises(ValueError, match=r"edge to 'next': bad weights"):
        RebalanceEdge("next", channels(2), ws)


def test_nan_weights_are_refused() -> None:
    with pytest.raises(ValueError):
        RebalanceEdge("next", channels(2), [float("nan"), 1.0])


# ---------------------------------------------------------------- Outputs batching


def test_only_whole_batches_before_linger_then_everything_on_force() -> None:
    async def main() -> None:
        (ch,) = chs = channels(1)
        out = Outputs([ForwardEdge("next", chs)], batch_size=4, linger_s=HOUR)
        assert out.flush_deadline() is None
        values, stamps = records(range(10))
        out.emit(values[:3], stamps[:3])
        deadline = out.flush_deadline()
        assert deadline is not None
        await out.flush()
        assert ch.log == []  # 3 < batch_size and the linger has not passed
        out.emit(values[3:], stamps[3:])
        assert out.flush_deadline() == deadline  # still the oldest record's time
        await out.flush()
        assert ch.batches() == [values[0:4], values[4:8]]
        assert ch.buf_v == values[8:]
        await out.flush(force=True)
        assert ch.batches() == [values[0:4], values[4:8], values[8:]]
        assert ch.delivered_stamps() == stamps
        assert ch.buf_v == [] and out.flush_deadline() is None
        assert out.records_out == 10 and ch.records_sent == 10

    run(main)


def test_everything_is_sent_once_the_linger_has_passed() -> None:
    async def main() -> None:
        (ch,) = chs = channels(1)
        out = Outputs([ForwardEdge("next", chs)], batch_size=4, linger_s=0.2)
        values, stamps = records(range(6))
        out.emit(values, stamps)
        await out.flush()
        assert ch.batches() == [values[:4]]
        # The linger is what is under test: past its deadline (however late), all goes.
        await asyncio.sleep(out.flush_deadline() - time.monotonic() + 0.01)
        await out.flush()
        assert ch.batches() == [values[:4], values[4:]]
        assert out.flush_deadline() is None

    run(main)


def test_emit_nothing_is_a_no_op() -> None:
    async def main() -> None:
        (ch,) = chs = channels(1)
        out = Outputs([ForwardEdge("next", chs)], batch_size=4, linger_s=0)
        out.emit([], [])
        assert out.flush_deadline() is None
        await out.flush(force=True)
        assert ch.log == [] and out.records_out == 0

    run(main)


def test_no_flush_deadline_once_whole_batches_left_nothing_pending() -> None:
    async def main() -> None:
        chs = channels(1)
        out = Outputs([ForwardEdge("next", chs)], batch_size=4, linger_s=HOUR)
        values, stamps = records(range(4))
        out.emit(values, stamps)
        await out.flush()
        assert chs[0].buf_v == []
        assert out.flush_deadline() is None

    run(main)


def test_broadcast_sends_pending_records_then_the_item_on_every_channel() -> None:
    async def main() -> None:
        fwd, a, b = RecordingChannel("fwd"), RecordingChannel("a"), RecordingChannel("b")
        out = Outputs([ForwardEdge("x", [fwd]), BroadcastEdge("y", [a, b])], 2, HOUR)
        values, stamps = records("abc")
        out.emit(values, stamps)
        barrier = Barrier(BarrierKind.RECONFIG, 7)
        await out.broadcast(barrier)
        await out.broadcast(EndOfStream())
        for ch in (fwd, a, b):
            assert ch.log == [
                ("batch", values[:2], stamps[:2]),
                ("batch", values[2:], stamps[2:]),
                ("control", barrier),
                ("control", EndOfStream()),
            ]
        assert out.flush_deadline() is None

    run(main)


def test_flush_waits_for_credit_and_keeps_order() -> None:
    async def main() -> None:
        ch = RecordingChannel("slow", credits=1)
        out = Outputs([ForwardEdge("x", [ch])], batch_size=2, linger_s=HOUR)
        values, stamps = records(range(5))
        out.emit(values, stamps)
        flushing = asyncio.create_task(out.flush(force=True))
        await turns()
        assert ch.batches() == [values[:2]]  # out of credit: the rest waits
        for n in (1, 2):
            ch.grant(1)
            await turns()
            assert len(ch.batches()) == 1 + n
        await flushing
        assert ch.delivered() == values
        assert ch.backpressure_s > 0
        assert out.backpressure_s() == ch.backpressure_s

    run(main)


# One step of a random emit/flush schedule: emit n records, flush(), or flush(force=True).
steps = st.lists(
    st.one_of(
        st.integers(0, 12).map(lambda n: ("emit", n)), st.sampled_from([("flush",), ("force",)])
    ),
    max_size=25,
)


@settings(max_examples=100, deadline=None)
@given(steps, st.integers(1, 6), owner_tables())
def test_outputs_deliver_what_edges_route_in_order_and_in_batches(ops, batch_size, table) -> None:
    n_keyed, max_parallelism, owner = table

    async def main() -> None:
        fwd = RecordingChannel("fwd")
        keyed = channels(n_keyed, "keyed")
        bcast = channels(2, "bcast")
        out = Outputs(
            [
                ForwardEdge("f", [fwd]),
                KeyGroupEdge("k", keyed, first, KeyGroupHasher(max_parallelism), owner),
                BroadcastEdge("b", bcast),
            ],
            batch_size,
            HOUR,
        )
        emitted: list = []
        for op in ops:
            if op[0] == "emit":
                values = [(f"k{len(emitted) + i}", len(emitted) + i) for i in range(op[1])]
                out.emit(values, [float(v[1]) for v in values])
                emitted += values
            else:
                before = [len(ch.log) for ch in out.channels]
                await out.flush(force=op[0] == "force")
                for ch, n in zip(out.channels, before, strict=True):
                    new = [len(entry[1]) for entry in ch.log[n:]]
                    if op[0] == "flush":  # linger not passed: whole batches only
                        assert all(size == batch_size for size in new)
                        assert len(ch.buf_v) < batch_size
                    else:
                        assert ch.buf_v == []
        await out.flush(force=True)

        expected = {"fwd": emitted, "bcast-0": emitted, "bcast-1": emitted}
        for i in range(n_keyed):
            expected[f"keyed-{i}"] = [
                v for v in emitted if owner[key_group(v[0], max_parallelism)] == i
            ]
        for ch in out.channels:
            assert ch.delivered() == expected[ch.key]
            assert ch.delivered_stamps() == [float(v[1]) for v in expected[ch.key]]
            assert all(1 <= len(b) <= batch_size for b in ch.batches())
        assert out.records_out == len(emitted)
        assert out.flush_deadline() is None

    run(main)
