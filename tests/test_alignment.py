"""Barrier alignment: invariants under random interleavings, and each protocol violation.

The property tests drive an :class:`Aligner` the way a task loop does: each input is a
FIFO stream of batches, barriers with increasing ids and an end of stream, and the
simulated task repeatedly reads one item from a random input the aligner does not block.
A model kept by the test (what each input has delivered, what was forwarded or aborted)
checks every decision.
"""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.alignment import Aligner, AlignmentError, Finished, Forward
from runtime.records import Barrier, BarrierKind, Batch, EndOfStream


def bar(barrier_id: int) -> Barrier:
    kind = BarrierKind.RECONFIG if barrier_id % 3 == 0 else BarrierKind.CHECKPOINT
    return Barrier(kind, barrier_id)


def draw_stream(draw, first: int, last: int) -> list:
    """Batches, barriers ``first..last`` in order, batches, end of stream."""
    items: list = []
    for barrier_id in range(first, last + 1):
        items += [Batch([barrier_id], [0.0])] * draw(st.integers(0, 2))
        items.append(bar(barrier_id))
    items += [Batch([None], [0.0])] * draw(st.integers(0, 2))
    items.append(EndOfStream())
    return items


@st.composite
def scenarios(draw) -> tuple[int, dict[str, list]]:
    """1..6 inputs, barriers 1..K; each input delivers a prefix (often all) then ends."""
    k = draw(st.integers(0, 5))
    n = draw(st.integers(1, 6))
    streams = {}
    for i in range(n):
        last = draw(st.one_of(st.just(k), st.integers(0, k)))
        streams[f"in{i}"] = draw_stream(draw, 1, last)
    return k, streams


class Task:
    """A simulated task loop around an Aligner, with a model that checks each decision."""

    def __init__(self, streams: dict[str, list]) -> None:
        self.aligner = Aligner(streams)
        self.queues = {i: deque(items) for i, items in streams.items()}
        self.last = dict.fromkeys(streams, 0)  # last barrier id delivered (or passed)
        self.ended: set[str] = set()
        self.removed: set[str] = set()
        self.pending: int | None = None
        self.forwarded: list[int] = []
        self.resolved: set[int] = set()  # forwarded, or aborted before being forwarded
        self.aborted: set[int] = set()  # aborted before being forwarded
        self.delivered_by: dict[int, set[str]] = {}
        self.finished = 0

    @property
    def open(self) -> set[str]:
        return set(self.queues) - self.ended - self.removed

    def ready(self) -> list[str]:
        return sorted(i for i in self.open if self.queues[i] and not self.aligner.is_blocked(i))

    def feed(self, input: str) -> None:
        after = self.last[input]
        # Consistent cut: an item that follows barrier `after` on this input is read
        # only once that barrier has been forwarded (or aborted).
        assert after == 0 or after in self.resolved, (input, after)
        item = self.queues[input].popleft()
        if isinstance(item, Batch):
            return
        if isinstance(item, EndOfStream):
            self.ended.add(input)
            self.handle(self.aligner.on_end(input))
            return
        self.last[input] = item.id
        self.delivered_by.setdefault(item.id, set()).add(input)
        if item.id not in self.resolved:
            self.pending = item.id
        self.handle(self.aligner.on_barrier(input, item))

    def abort(self, barrier_id: int) -> None:
        if barrier_id not in self.forwarded:
            self.aborted.add(barrier_id)
            self.resolved.add(barrier_id)
            if self.pending == barrier_id:
                self.pending = None
        self.aligner.abort(barrier_id)
        self.check_views()

    def add(self, input: str, stream: list) -> None:
        self.queues[input] = deque(stream)
        self.aligner.add_input(input)
        if self.pending is not None:
            self.last[input] = self.pending
            self.delivered_by.setdefault(self.pending, set()).add(input)
        else:
            self.last[input] = self.forwarded[-1] if self.forwarded else 0
        self.check_views()

    def remove(self, input: str) -> None:
        self.removed.add(input)
        self.handle(self.aligner.remove_input(input))

    def handle(self, decision) -> None:
        assert self.finished == 0, "decision after Finished"
        if isinstance(decision, Forward):
            barrier_id = decision.barrier.id
            assert barrier_id == self.pending
            assert not self.forwarded or barrier_id > self.forwarded[-1]
            # Every open input has delivered it, and none has delivered a later one.
            assert all(self.last[i] == barrier_id for i in self.open), (barrier_id, self.last)
            self.forwarded.append(barrier_id)
            self.resolved.add(barrier_id)
            self.pending = None
        elif isinstance(decision, Finished):
            assert not self.open
            self.finished += 1
            self.pending = None
        else:
            assert decision is None
        self.check_views()

    def check_views(self) -> None:
        if self.finished:
            return
        a = self.aligner
        assert a.open_inputs == self.open
        assert (a.pending.id if a.pending else None) == self.pending
        expected_blocked = {i for i in self.open if self.last[i] == self.pending}
        assert a.blocked == expected_blocked
        assert all(a.is_blocked(i) == (i in expected_blocked) for i in self.open)

    def run_to_end(self, data) -> None:
        while not self.finished:
            ready = self.ready()
            assert ready, "deadlock: no open input is both unblocked and non-empty"
            self.feed(data.draw(st.sampled_from(ready)))


@given(scenarios(), st.data())
def test_alignment_forwards_each_barrier_once_in_order_and_finishes(scenario, data):
    _, streams = scenario
    task = Task(streams)
    task.run_to_end(data)
    highest = max(sum(isinstance(x, Barrier) for x in s) for s in streams.values())
    # (a) every barrier some input delivered is forwarded once, in order; those every
    # input ended before delivering are not.
    assert task.forwarded == list(range(1, highest + 1))
    # (d) Finished exactly once, after every input ended and was fully read.
    assert task.finished == 1
    assert task.ended == set(streams)
    assert not any(task.queues.values())


@given(scenarios(), st.data())
def test_aborted_barriers_are_never_forwarded_and_never_block(scenario, data):
    k, streams = scenario
    task = Task(streams)
    aborts_left = 2 * k + 2
    while not task.finished:
        if aborts_left and data.draw(st.integers(0, 3)) == 0:
            aborts_left -= 1
            task.abort(data.draw(st.integers(1, k + 1)))
            continue
        ready = task.ready()
        assert ready, "deadlock"
        task.feed(data.draw(st.sampled_from(ready)))
    highest = max(sum(isinstance(x, Barrier) for x in s) for s in streams.values())
    expected = [b for b in range(1, highest + 1) if b not in task.aborted]
    assert task.forwarded == expected
    assert task.finished == 1
    assert not any(task.queues.values())


@given(scenarios(), st.data())
def test_inputs_added_and_removed_between_items(scenario, data):
    k, streams = scenario
    task = Task(streams)
    adds_left, removes_left = 3, 3
    while not task.finished:
        action = data.draw(st.sampled_from(["feed", "feed", "add", "remove"]))
        known = sorted(set(task.queues) - task.removed)
        if action == "add" and adds_left:
            adds_left -= 1
            joined = task.pending or (task.forwarded[-1] if task.forwarded else 0)
            last = data.draw(st.integers(joined, max(joined, k)))
            task.add(f"new{adds_left}", draw_stream(data.draw, joined + 1, last))
        elif action == "remove" and removes_left and len(known) > 1:
            removes_left -= 1
            task.remove(data.draw(st.sampled_from(known)))
        else:
            ready = task.ready()
            assert ready, "deadlock"
            task.feed(data.draw(st.sampled_from(ready)))
    assert task.finished == 1
    assert task.ended | task.removed == set(task.queues)
    assert set(task.forwarded) <= set(task.delivered_by)
    for barrier_id, inputs in task.delivered_by.items():
        if barrier_id not in task.forwarded:
            # Only dropped at Finished, once everything that delivered it was removed.
            assert inputs <= task.removed, (barrier_id, inputs)


# Examples.


def test_two_inputs_align_then_unblock():
    a = Aligner(["x", "y"])
    assert a.on_barrier("x", bar(1)) is None
    assert a.is_blocked("x") and not a.is_blocked("y")
    assert a.pending == bar(1) and a.blocked == {"x"}
    assert a.on_barrier("y", bar(1)) == Forward(bar(1))
    assert a.pending is None and a.blocked == frozenset()
    assert a.on_end("x") is None
    assert a.on_end("y") == Finished()


def test_single_input_forwards_at_once():
    a = Aligner(["x"])
    assert a.on_barrier("x", bar(7)) == Forward(bar(7))
    assert a.on_end("x") == Finished()


def test_end_of_the_last_unaligned_input_completes_the_alignment():
    a = Aligner(["x", "y", "z"])
    a.on_barrier("x", bar(1))
    a.on_barrier("y", bar(1))
    assert a.on_end("z") == Forward(bar(1))
    assert a.open_inputs == {"x", "y"} and not a.blocked


def test_abort_unblocks_and_late_arrivals_are_ignored():
    a = Aligner(["x", "y"])
    a.on_barrier("x", bar(1))
    a.abort(1)
    assert a.pending is None and not a.is_blocked("x")
    assert a.on_barrier("y", bar(1)) is None
    assert not a.is_blocked("y")
    a.on_barrier("x", bar(2))
    assert a.on_barrier("y", bar(2)) == Forward(bar(2))


def test_abort_before_arrival_and_after_forwarding():
    a = Aligner(["x", "y"])
    a.abort(3)
    assert a.on_barrier("x", bar(3)) is None and not a.blocked
    a.on_barrier("x", bar(4))
    assert a.on_barrier("y", bar(4)) == Forward(bar(4))
    a.abort(4)  # too late: nothing to drop
    assert a.pending is None
    with pytest.raises(AlignmentError):
        a.on_barrier("y", bar(3))  # not newer than y's barrier 4


def test_newer_barrier_subsumes_the_pending_one():
    a = Aligner(["x", "y"])
    a.on_barrier("x", bar(1))
    assert a.on_barrier("y", bar(2)) is None
    assert a.pending == bar(2) and a.blocked == {"y"}
    assert a.on_barrier("x", bar(2)) == Forward(bar(2))


def test_removing_the_awaited_input_completes_the_alignment():
    a = Aligner(["x", "y"])
    a.on_barrier("x", bar(1))
    assert a.remove_input("y") == Forward(bar(1))
    assert a.open_inputs == {"x"}


def test_removing_the_last_open_input_finishes_and_drops_the_pending_barrier():
    a = Aligner(["x", "y", "z"])
    a.on_barrier("x", bar(1))
    a.on_end("z")
    assert a.remove_input("x") is None
    assert a.remove_input("y") == Finished()
    assert a.pending is None
    assert a.remove_input("z") is None  # ended inputs may still be removed


def test_input_added_while_pending_has_passed_that_barrier():
    a = Aligner(["x", "y"])
    a.on_barrier("x", bar(1))
    a.add_input("z")
    assert a.is_blocked("z")  # its items come after barrier 1
    assert a.on_barrier("y", bar(1)) == Forward(bar(1))  # not waited for
    assert not a.is_blocked("z")
    with pytest.raises(AlignmentError, match=r"'z'.*barrier 1"):
        a.on_barrier("z", bar(1))
    a.on_barrier("z", bar(2))
    a.on_barrier("x", bar(2))
    assert a.on_barrier("y", bar(2)) == Forward(bar(2))


def test_removed_input_may_be_added_again():
    a = Aligner(["x", "y"])
    a.remove_input("y")
    a.add_input("y")
    assert a.open_inputs == {"x", "y"}


# Protocol violations.


def test_no_inputs_is_a_value_error():
    with pytest.raises(ValueError, match="at least one input"):
        Aligner([])


def test_alignment_error_is_a_runtime_error():
    assert issubclass(AlignmentError, RuntimeError)


@pytest.mark.parametrize(
    "call",
    [
        lambda a: a.on_barrier("w", bar(1)),
        lambda a: a.on_end("w"),
        lambda a: a.remove_input("w"),
        lambda a: a.is_blocked("w"),
    ],
    ids=["barrier", "end", "remove", "is_blocked"],
)
def test_unknown_input(call):
    a = Aligner(["x", "y"])
    with pytest.raises(AlignmentError, match=r"unknown input 'w'"):
        call(a)


def test_barrier_on_ended_input():
    a = Aligner(["x", "y"])
    a.on_end("x")
    with pytest.raises(AlignmentError, match=r"barrier 1 on input 'x'.*ended"):
        a.on_barrier("x", bar(1))


def test_end_on_ended_input():
    a = Aligner(["x", "y"])
    a.on_end("x")
    with pytest.raises(AlignmentError, match=r"end of stream on input 'x'.*ended"):
        a.on_end("x")


def test_second_barrier_on_blocked_input():
    a = Aligner(["x", "y"])
    a.on_barrier("x", bar(1))
    with pytest.raises(AlignmentError, match=r"barrier 2 on input 'x'.*blocked.*barrier 1"):
        a.on_barrier("x", bar(2))
    assert a.pending == bar(1) and a.blocked == {"x"}  # unchanged


def test_end_on_blocked_input():
    a = Aligner(["x", "y"])
    a.on_barrier("x", bar(1))
    with pytest.raises(AlignmentError, match=r"end of stream on input 'x'.*blocked.*barrier 1"):
        a.on_end("x")


def test_barrier_older_than_pending():
    a = Aligner(["x", "y"])
    a.on_barrier("x", bar(5))
    with pytest.raises(AlignmentError, match=r"barrier 4 on input 'y'.*older.*pending barrier 5"):
        a.on_barrier("y", bar(4))


def test_barrier_not_newer_than_the_inputs_previous_one():
    a = Aligner(["x"])
    a.on_barrier("x", bar(2))
    with pytest.raises(AlignmentError, match=r"barrier 2 on input 'x'.*previous barrier 2"):
        a.on_barrier("x", bar(2))


def test_barrier_not_newer_than_the_last_forwarded_one():
    a = Aligner(["x", "y"])
    a.on_barrier("x", bar(2))
    a.on_barrier("y", bar(2))
    a.remove_input("y")
    a.add_input("y")
    with pytest.raises(AlignmentError, match=r"barrier 1 on input 'y'.*barrier 2"):
        a.on_barrier("y", bar(1))


def test_adding_a_known_input():
    a = Aligner(["x", "y"])
    a.on_end("y")
    for known in ("x", "y"):
        with pytest.raises(AlignmentError, match=rf"'{known}' is already an input"):
            a.add_input(known)


def test_adding_after_finished():
    a = Aligner(["x"])
    a.on_end("x")
    with pytest.raises(AlignmentError, match=r"cannot add input 'y'"):
        a.add_input("y")


def test_removing_the_last_input():
    a = Aligner(["x"])
    with pytest.raises(AlignmentError, match=r"'x'.*last input"):
        a.remove_input("x")
