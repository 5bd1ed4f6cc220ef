"""Event time without workers: timestamps, the source clock, watermark tracking, window
assignment and the window logic's contract, driven through a real keyed processor."""

from __future__ import annotations

import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime import Dataflow
from runtime.dataflow import DataflowError, InputSpec, JobGraph, OperatorSpec
from runtime.eventtime import (
    RESOLUTION_S,
    EventTime,
    EventTimeError,
    SourceClock,
    WatermarkTracker,
)
from runtime.metrics import TaskMetrics
from runtime.operators import make_processor
from runtime.partitioning import Outputs
from runtime.records import Watermark
from runtime.state import TIMERS, KeyedState
from runtime.timers import TimerTable
from runtime.windows import (
    Count,
    CountWindow,
    LateRecord,
    Mean,
    Reduce,
    Session,
    Sliding,
    Tumbling,
    WindowResult,
    is_late,
)
from tests.time_jobs import Events, PerSecond, event_ms, key_of


def test_event_time_reads_a_field_an_attribute_or_a_function_and_names_a_bad_record() -> None:
    assert EventTime("t").stamps([{"t": 5}, {"t": 7.5}]) == [5.0, 7.5]
    assert EventTime(event_ms, per_second=1000).stamps([("k", 1_700_000_010_000, 1)]) == [
        1_700_000_010.0
    ]
    with pytest.raises(EventTimeError, match=r"record \{'x': 1\} has no event time.*'t'"):
        EventTime("t").stamps([{"t": 1}, {"x": 1}])
    for bad, match in [
        ({"timestamp": ""}, "must name a field"),
        ({"timestamp": "t", "max_out_of_orderness_s": -1}, "max_out_of_orderness_s"),
        ({"timestamp": "t", "idle_timeout_s": 0}, "idle_timeout_s"),
        ({"timestamp": "t", "per_second": 0}, "per_second"),
    ]:
        with pytest.raises(ValueError, match=match):
            EventTime(**bad)


def test_only_a_source_has_event_time_and_bad_window_options_name_the_operator() -> None:
    flow = Dataflow("bad")
    src = flow.source("src", Events(), event_time=EventTime("t"))
    with pytest.raises(DataflowError, match="operator 'w': window: give exactly one"):
        src.key_by(key_of).window("w", Tumbling(1.0))
    with pytest.raises(ValueError, match=r"slide_s=2.0\) must not exceed size_s=1.0"):
        Sliding(1.0, 2.0)
    with pytest.raises(DataflowError, match=r"operator .w.: window: late must be"):
        src.key_by(key_of).window("w", Tumbling(1.0), aggregate=Count(), late="keep")
    src_op = OperatorSpec("src", "source", Events())
    mapped = OperatorSpec("m", "map", key_of, 1, (InputSpec("src"),), event_time=EventTime("t"))
    with pytest.raises(DataflowError, match="'m': only a source assigns event time"):
        JobGraph.of("x", [src_op, mapped])


def test_the_source_clock_trails_the_highest_time_by_the_bound_per_split() -> None:
    clock = SourceClock(EventTime("t", max_out_of_orderness_s=2.0, idle_timeout_s=5.0))
    clock.add("a", 0.0)
    clock.add("b", 0.0)
    assert clock.watermark(0.0) == -math.inf  # b has sent nothing: it holds time back
    clock.observe("a", [10.0, 12.0, 11.0], 1.0)
    clock.observe("b", [20.0], 1.0)
    w = 12.0 - 2.0 - RESOLUTION_S  # min(12, 20) - 2: a record at 10.0 is still on time
    assert clock.watermark(1.0) == w
    assert clock.due(1.0) == Watermark(w)
    assert clock.due(1.05) is None  # at most every WATERMARK_INTERVAL_S
    clock.observe("b", [30.0], 4.0)
    assert clock.watermark(7.0) == 30.0 - 2.0 - RESOLUTION_S  # a idle since 1.0: left out
    clock.end("b")
    assert clock.watermark(7.0) is None  # a idle, b over: the task is idle
    assert clock.due(7.0) == Watermark(w, idle=True)
    assert clock.before_records() == Watermark(w)  # active again, where it was
    clock.reset()  # a reconfiguration: it announces what it reads now, lower or not
    clock.add("c", 7.5)  # a partition that came with it, nothing read of it yet
    clock.observe("c", [9.0], 7.5)
    assert clock.due(7.5) == Watermark(9.0 - 2.0 - RESOLUTION_S)  # a is idle; c holds it
    clock.remove("a")
    clock.remove("c")
    assert clock.watermark(8.0) == math.inf  # every split it reads has ended
    assert clock.final() == Watermark(math.inf)


inputs = st.sampled_from(["x", "y", "z"])
events = st.lists(
    st.one_of(
        st.tuples(st.just("mark"), inputs, st.integers(0, 50), st.booleans()),
        st.tuples(st.just("remove"), inputs, st.just(0), st.just(False)),
        st.tuples(st.just("add"), inputs, st.just(0), st.just(False)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_a_task_watermark_is_the_least_over_active_inputs_and_never_goes_back(ops) -> None:
    """Whatever marks, idle marks, removals and additions come: each watermark the task
    forwards is at least the one before, and it is the least of the active inputs' marks
    whenever one rises (an input that has sent nothing holds it at -inf)."""
    tracker = WatermarkTracker(["x", "y"])
    marks: dict[str, float] = {"x": -math.inf, "y": -math.inf}
    idle: set[str] = set()
    forwarded: list[Watermark] = []
    for op, key, t, is_idle in ops:
        if op == "mark":
            if key not in marks:
                continue
            out = tracker.on_watermark(key, Watermark(float(t), is_idle))
            if is_idle:
                idle.add(key)
            else:
                idle.discard(key)
                marks[key] = max(marks[key], float(t))
        elif op == "remove":
            out = tracker.remove_input(key)
            marks.pop(key, None)
            idle.discard(key)
        else:
            tracker.add_input(key)
            marks.setdefault(key, -math.inf)
            out = tracker.refresh()
        if out is not None:
            forwarded.append(out)
            active = [w for k, w in marks.items() if k not in idle]
            if out.idle:
                assert not active
            else:
                assert out.time == max(
                    min(active), max((f.time for f in forwarded[:-1]), default=-math.inf)
                )
    times = [f.time for f in forwarded]
    assert times == sorted(times)


def test_after_a_reconfiguration_barrier_a_task_waits_for_every_input_to_speak_again() -> None:
    """The partition that held input x back moves to input y's task, which had announced
    more: after the barrier the task forwards nothing until both re-announce, then the
    lowest, even below what it sent before; its timers' watermark never goes back."""
    tracker = WatermarkTracker(["x", "y"])
    tracker.on_watermark("x", Watermark(10.0))
    assert tracker.on_watermark("y", Watermark(50.0)) == Watermark(10.0)
    tracker.reset()
    assert tracker.on_watermark("x", Watermark(60.0)) is None  # y has not spoken again
    assert tracker.on_watermark("y", Watermark(8.0)) == Watermark(8.0)  # the partition's
    assert (tracker.forwarded, tracker.current) == (8.0, 10.0)
    assert tracker.on_watermark("y", Watermark(70.0)) == Watermark(60.0)
    assert tracker.current == 60.0
    assert tracker.reannounce() == Watermark(60.0)  # a fluid stage's barrier started here


@given(st.floats(1e9, 2e9), st.sampled_from([(10.0, 2.0), (1.0, 0.25), (3.0, 3.0)]))
def test_a_time_falls_in_the_sliding_windows_that_contain_it(t: float, spec) -> None:
    size, slide = spec
    spans = Sliding(size, slide).assign(t)
    assert len(spans) == round(size / slide)
    assert all(s <= t < e and math.isclose(e - s, size) for s, e in spans)
    (tumbling,) = Tumbling(size).assign(t)
    assert tumbling[0] <= t < tumbling[1]


def test_aggregates_merge_for_sessions_and_reduce_starts_from_the_first_record() -> None:
    mean = Mean()
    assert mean.result(mean.merge(mean.add(mean.create(), 2), mean.add(mean.create(), 4))) == 3
    add = Reduce(max)
    assert add.result(add.create()) is None
    assert add.result(add.add(add.add(add.create(), 3), 1)) == 3


def test_timers_pickle_with_their_group_and_the_reserved_key_stays_itself() -> None:
    table = TimerTable()
    table.event[5.0] = {"k": None}
    back = pickle.loads(pickle.dumps({TIMERS: table, "k": 1}))
    assert back[TIMERS] == table and next(iter(back)) is TIMERS
    state = KeyedState("t", [0])
    state.group(0).update(back)
    assert list(state.items()) == [(0, "k", 1)] and len(state) == 1


class Harness:
    """A real keyed processor (the one workers build) fed batches by hand."""

    def __init__(self, logic) -> None:
        flow = Dataflow("h")
        src = flow.source("src", Events(), event_time=EventTime(event_ms, per_second=1000))
        src.key_by(key_of).process("op", logic)
        self.op = flow.compile().operator("op")
        self.state = KeyedState("op-0", range(self.op.max_parallelism))
        self.metrics = TaskMetrics(self.op.max_parallelism)
        self.outputs = Outputs([], 512, 0.0)
        self.emitted: list = []
        self.outputs.emit = lambda values, stamps: self.emitted.extend(
            zip(values, stamps, strict=True)
        )
        self.p = make_processor("op-0", self.op, 0, self.outputs, self.metrics, self.state)

    def feed(self, *events: tuple) -> None:
        self.p.process(key_of, list(events), [e[1] / 1000 for e in events])

    def take(self) -> list:
        out, self.emitted = self.emitted, []
        return out


def test_a_window_fires_once_the_watermark_passes_its_end_stamped_just_before_it() -> None:
    from runtime.windows import WindowLogic

    h = Harness(WindowLogic(Tumbling(1.0), Count()))
    h.feed(("a", 1_000, 0), ("a", 1_500, 0), ("b", 1_999, 0), ("a", 2_100, 0))
    h.p.on_watermark(1.999)
    assert h.take() == []  # the window [1, 2) closes at 2 - RESOLUTION_S
    h.p.on_watermark(2.0)
    assert sorted(h.take()) == [
        (WindowResult("a", 1.0, 2.0, 2), 2.0 - RESOLUTION_S),
        (WindowResult("b", 1.0, 2.0, 1), 2.0 - RESOLUTION_S),
    ]
    h.feed(("a", 1_200, 0))  # its only window closed: late, dropped and counted
    assert h.take() == [] and h.metrics.late_records == 1
    h.p.on_watermark(math.inf)
    assert h.take() == [(WindowResult("a", 2.0, 3.0, 1), 3.0 - RESOLUTION_S)]
    assert all(TIMERS not in h.state.group(g) for g in h.state.owned())  # nothing left


def test_allowed_lateness_updates_a_closed_window_and_late_records_can_be_sent_on() -> None:
    from runtime.windows import WindowLogic

    h = Harness(WindowLogic(Tumbling(1.0), Count(), allowed_lateness_s=1.0, late="emit"))
    h.feed(("a", 1_000, 0))
    h.p.on_watermark(2.5)
    assert [r for r, _ in h.take()] == [WindowResult("a", 1.0, 2.0, 1)]
    h.feed(("a", 1_700, 0))  # after the close, within the lateness: fired again at once
    assert [r for r, _ in h.take()] == [WindowResult("a", 1.0, 2.0, 2)]
    h.p.on_watermark(3.0)  # the lateness is over: the window's state goes
    h.feed(("a", 1_800, 7))
    (late,) = h.take()
    assert is_late(late[0]) and late[0] == LateRecord("a", ("a", 1_800, 7), 1.8)


def test_sessions_merge_when_they_overlap_and_close_after_the_gap() -> None:
    from runtime.windows import WindowLogic

    h = Harness(WindowLogic(Session(1.0), Count()))
    h.feed(("a", 1_000, 0), ("a", 2_500, 0))  # two sessions: [1, 2) and [2.5, 3.5)
    h.feed(("a", 1_800, 0))  # [1.8, 2.8) overlaps both: one session [1, 3.5)
    h.feed(("b", 1_000, 0), ("b", 2_000, 0))  # exactly the gap apart: two sessions
    h.p.on_watermark(3.4)
    assert sorted(r for r, _ in h.take()) == [
        WindowResult("b", 1.0, 2.0, 1),
        WindowResult("b", 2.0, 3.0, 1),
    ]
    h.p.on_watermark(3.5)
    assert [r for r, _ in h.take()] == [WindowResult("a", 1.0, 3.5, 3)]


def test_count_windows_close_with_their_last_record_and_updates_come_per_record() -> None:
    from runtime.windows import WindowLogic

    h = Harness(WindowLogic(CountWindow(2), Count()))
    h.feed(("a", 1, 0), ("a", 2, 0), ("a", 3, 0))
    assert [r for r, _ in h.take()] == [WindowResult("a", 0, 2, 2)]
    h = Harness(WindowLogic(Tumbling(1.0), Count(), emit="update"))
    h.feed(("a", 1_000, 0), ("a", 1_100, 0))
    assert [r.value for r, _ in h.take()] == [1, 2]
    h.p.on_watermark(math.inf)
    assert h.take() == []


def test_processing_time_timers_fire_when_the_wall_clock_passes_them() -> None:
    from runtime.windows import WindowLogic

    h = Harness(WindowLogic(Tumbling(1.0), Count(), time="processing"))
    h.feed(("a", 1, 0))
    assert h.p.wakeup < math.inf
    wake = h.p.wakeup
    h.p.on_processing_time(wake - 0.5)
    assert h.take() == []
    h.p.on_processing_time(wake)
    ((result, stamp),) = h.take()
    assert result.key == "a" and result.value == 1 and stamp == wake == result.end
    assert h.p.wakeup == math.inf


def test_timers_of_a_group_that_arrives_are_indexed_and_fire_when_due() -> None:
    """A key group's timers travel in its state: taken in by another processor (a live
    move), they fire there once its watermark passes them."""
    a = Harness(PerSecond())
    a.feed(("k", 1_500, 3))
    (group,) = [g for g in a.state.owned() if a.state.group(g)]
    data = a.state.export_group(group)
    b = Harness(PerSecond())
    b.state.drop_group(group)
    b.p.await_groups([group])
    b.p.on_watermark(1.5)
    b.p.arrive(group, data)
    assert b.take() == []
    b.p.on_watermark(2.0)
    assert b.take() == [(("k", 2.0, 3), 2.0)]


def test_a_logic_swap_to_timers_and_back_rebuilds_the_processor_over_the_same_state() -> None:
    """A keyed operator's logic swapped live from a plain function to one with timers gets
    a processor that fires them (over the same key groups); swapped back, the timers are
    forgotten, marked changed for the next checkpoint."""
    from runtime.operators import swap_logic
    from tests.time_jobs import PerSecond

    h = Harness(PerSecond())
    plain = h.p
    h.p.note_changes()
    h.p = swap_logic(h.p, plain_sum, 0)
    assert type(h.p).__name__ == "KeyedProcessor" and h.p.state is plain.state
    h.feed(("a", 1_500, 3))
    h.p = swap_logic(h.p, PerSecond(), 0)
    assert h.p.changed is plain.changed
    h.feed(("k", 1_600, 4))
    h.p.on_watermark(2.0)
    assert h.take() == [(("k", 2.0, 4), 2.0)]
    h.feed(("k", 2_500, 1))
    h.p = swap_logic(h.p, plain_sum, 0)
    assert all(TIMERS not in h.state.group(g) for g in h.state.owned())
    assert any(TIMERS in keys for keys in h.p.take_changes().values())


def plain_sum(key: str, event: tuple, state) -> None:
    state.set((state.get() or 0) + event[2])


def test_records_that_waited_for_their_key_group_are_judged_by_the_watermark_they_came_under() -> (
    None
):
    """Fluid mode: a record of a key group whose state is on its way waits; the watermark
    may pass its window meanwhile. When the state comes the record counts in its window
    (it was on time when it came), then the window closes."""
    from runtime.windows import WindowLogic

    h = Harness(WindowLogic(Session(0.25), Count()))
    h.feed(("k", 1_000, 0))
    (group,) = [g for g in h.state.owned() if h.state.group(g)]
    data = h.state.export_group(group)
    h.state.drop_group(group)
    h.p.await_groups([group])
    h.feed(("k", 1_100, 0))  # waits for the group, under no later watermark
    h.p.on_watermark(2.0)  # both sessions would have closed by now
    assert h.take() == []
    h.p.arrive(group, data)
    assert [r for r, _ in h.take()] == [WindowResult("k", 1.0, 1.35, 2)]
    assert h.metrics.late_records == 0
