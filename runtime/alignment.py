"""Barrier alignment for a task with several inputs: a pure state machine, no I/O.

The task loop reads items from each input channel in FIFO order and tells an
:class:`Aligner` about the control items; record batches are not its business. The
machine answers with a :data:`Decision`:

- :class:`Forward` ``(barrier)``: every open input has delivered ``barrier``. The task
  forwards it downstream (and, if the barrier asks for it, snapshots or pauses); all
  inputs are already unblocked when the call returns.
- :class:`Finished`: every input has ended. The task forwards end of stream.
- ``None``: nothing to do.

Contract (aligned barriers, as in Flink's aligned checkpoints):

1. When an input delivers barrier ``B`` it is *blocked*: the task must not read from it
   again (:meth:`Aligner.is_blocked`) until the alignment of ``B`` completes or is aborted.
2. The alignment of ``B`` completes when every open input has delivered ``B``. An input
   that has ended counts as aligned for every barrier from then on, so an input that
   ends, or is removed, may complete a pending alignment.
3. At most one barrier is pending at a time, and barrier ids grow on every input.
   A barrier newer than the pending one on an input that has not delivered the pending
   one means that input's upstream skipped the pending barrier (it was aborted there):
   the pending barrier can never complete, so it is dropped (subsumed, as in Flink) and
   alignment of the newer one starts.
4. :meth:`Aligner.abort` drops the pending alignment of that id (its inputs unblock,
   nothing is forwarded) or, for an id not seen yet, marks it aborted in advance.
   Arrivals of an aborted id are ignored: they neither block nor forward.
5. When the last open input ends (or is removed) the machine reports :class:`Finished`
   exactly once; a barrier still pending then is dropped, since downstream sees end of
   stream on this channel, which aligns it there.
6. Inputs may be added and removed between items (reconfiguration). An input added
   while a barrier ``B`` is pending joined after ``B`` was injected: it is treated as
   having delivered ``B``, so the alignment does not wait for it and it stays blocked
   (its items come after ``B``) until ``B`` completes or is aborted; a later arrival of
   ``B`` or an older barrier on it is a protocol violation. Likewise an input added
   with nothing pending is treated as having passed every barrier forwarded so far.

Exceptions::

    RuntimeError
     └── AlignmentError    the caller broke the channel protocol: an event for an
                           unknown or ended input, a barrier or end read from a blocked
                           input, a barrier older than the pending one or not newer
                           than the input's previous one, adding a known input, adding
                           after Finished, removing the last input
    ValueError             Aligner() with no inputs (a source does not align)

A method that raises leaves the machine unchanged.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from .errors import StreamRuntimeError
from .records import Barrier

__all__ = ["Aligner", "AlignmentError", "Decision", "Finished", "Forward"]


class AlignmentError(StreamRuntimeError, RuntimeError):
    """An event that a correct caller of the channel protocol never produces."""


@dataclass(frozen=True, slots=True)
class Forward:
    """The alignment of ``barrier`` completed: forward it downstream; inputs are unblocked."""

    barrier: Barrier


@dataclass(frozen=True, slots=True)
class Finished:
    """Every input has ended: forward end of stream."""


Decision = Forward | Finished | None


class Aligner:
    """The alignment state of one task over its input channels (see the module contract).

    Inputs are any hashable ids. The task loop calls :meth:`on_barrier` and
    :meth:`on_end` as it reads those items, :meth:`abort` when the coordinator aborts a
    barrier, :meth:`add_input` / :meth:`remove_input` when a reconfiguration changes
    its upstream channels, and reads only from inputs for which :meth:`is_blocked` is
    false.
    """

    def __init__(self, inputs: Iterable[Hashable]) -> None:
        self._open: set[Hashable] = set(inputs)
        if not self._open:
            raise ValueError("an Aligner needs at least one input (a source does not align)")
        self._ended: set[Hashable] = set()
        # Id of the last barrier each open input delivered, or was treated as having
        # passed; None before its first one.
        self._last: dict[Hashable, int | None] = dict.fromkeys(self._open)
        self._pending: Barrier | None = None
        self._arrived: set[Hashable] = set()  # open inputs that delivered the pending one
        self._forwarded: int | None = None  # id of the last forwarded barrier
        self._aborted: set[int] = set()  # ids aborted and not yet passed by a forward
        self._finished = False

    # Events from the input channels.

    def on_barrier(self, input: Hashable, barrier: Barrier) -> Decision:
        """``input`` delivered ``barrier``; returns :class:`Forward` if that completes it.

        Raises :class:`AlignmentError` if ``input`` is unknown, ended or blocked, if the
        id is not newer than the previous barrier on ``input`` or than the last forwarded
        one, or if it is older than the pending barrier (and not aborted).
        """
        self._check_open(input, f"barrier {barrier.id}")
        if input in self._arrived:
            assert self._pending is not None
            raise AlignmentError(
                f"barrier {barrier.id} on input {input!r}, which is blocked since it "
                f"delivered barrier {self._pending.id}: a blocked input must not be read"
            )
        last = self._last[input]
        if last is not None and barrier.id <= last:
            raise AlignmentError(
                f"barrier {barrier.id} on input {input!r} is not newer than its previous "
                f"barrier {last}"
            )
        if barrier.id in self._aborted:
            self._last[input] = barrier.id
            return None
        if self._forwarded is not None and barrier.id <= self._forwarded:
            raise AlignmentError(
                f"barrier {barrier.id} on input {input!r} is not newer than barrier "
                f"{self._forwarded}, already forwarded"
            )
        pending = self._pending
        if pending is not None and barrier.id < pending.id:
            raise AlignmentError(
                f"barrier {barrier.id} on input {input!r} is older than the pending "
                f"barrier {pending.id}"
            )
        self._last[input] = barrier.id
        if pending is not None and barrier.id > pending.id:
            # The upstream of `input` skipped the pending barrier: it can never complete.
            self._aborted.add(pending.id)
            self._pending = None
            self._arrived.clear()
        if self._pending is None:
            self._pending = barrier
        self._arrived.add(input)
        return self._try_complete()

    def on_end(self, input: Hashable) -> Decision:
        """``input`` delivered end of stream; returns :class:`Finished` if it was the last
        open input, or :class:`Forward` if its end completes the pending alignment.

        Raises :class:`AlignmentError` if ``input`` is unknown, already ended or blocked.
        """
        self._check_open(input, "end of stream")
        if input in self._arrived:
            assert self._pending is not None
            raise AlignmentError(
                f"end of stream on input {input!r}, which is blocked since it delivered "
                f"barrier {self._pending.id}: a blocked input must not be read"
            )
        self._open.discard(input)
        del self._last[input]
        self._ended.add(input)
        return self._after_input_left()

    def abort(self, barrier_id: int) -> None:
        """The coordinator aborted barrier ``barrier_id``.

        If it is pending, its alignment is dropped and every input unblocks; nothing is
        forwarded. Either way, later arrivals of that id are ignored. Aborting an id
        already forwarded (the abort came too late for this task) changes nothing.
        """
        if self._forwarded is not None and barrier_id <= self._forwarded:
            return
        self._aborted.add(barrier_id)
        if self._pending is not None and self._pending.id == barrier_id:
            self._pending = None
            self._arrived.clear()

    # Reconfiguration of the input set.

    def add_input(self, input: Hashable) -> None:
        """A new upstream channel joined; see rule 6 of the module contract.

        Raises :class:`AlignmentError` if ``input`` is already an input (open or ended)
        or if the machine has finished.
        """
        if self._finished:
            raise AlignmentError(f"cannot add input {input!r}: every input has ended")
        if input in self._open or input in self._ended:
            raise AlignmentError(f"input {input!r} is already an input")
        self._open.add(input)
        if self._pending is not None:
            self._last[input] = self._pending.id
            self._arrived.add(input)
        else:
            self._last[input] = self._forwarded

    def remove_input(self, input: Hashable) -> Decision:
        """An upstream channel left (open or ended); the id may be added again later.

        Returns :class:`Forward` if the pending alignment waited only for ``input``, or
        :class:`Finished` if every remaining input has ended. Raises
        :class:`AlignmentError` if ``input`` is unknown, or if it is the last open input
        and no other input remains: add the replacement first.
        """
        if input in self._ended:
            self._ended.discard(input)
            return None
        if input not in self._open:
            raise AlignmentError(f"cannot remove unknown input {input!r}")
        if not self._ended and self._open == {input}:
            raise AlignmentError(
                f"cannot remove input {input!r}: it is the last input (add its replacement first)"
            )
        self._open.discard(input)
        del self._last[input]
        self._arrived.discard(input)
        return self._after_input_left()

    # Queries.

    def is_blocked(self, input: Hashable) -> bool:
        """Whether the task must not read from ``input`` now (false for an ended input).

        Raises :class:`AlignmentError` if ``input`` is unknown.
        """
        if input not in self._open and input not in self._ended:
            raise AlignmentError(f"unknown input {input!r}")
        return input in self._arrived

    @property
    def pending(self) -> Barrier | None:
        """The barrier being aligned, if any."""
        return self._pending

    @property
    def open_inputs(self) -> frozenset:
        """Inputs that have neither ended nor been removed."""
        return frozenset(self._open)

    @property
    def blocked(self) -> frozenset:
        """Inputs the task must not read from now."""
        return frozenset(self._arrived)

    # Internals.

    def _check_open(self, input: Hashable, what: str) -> None:
        if input in self._ended:
            raise AlignmentError(f"{what} on input {input!r}, which has already ended")
        if input not in self._open:
            raise AlignmentError(f"{what} on unknown input {input!r}")

    def _after_input_left(self) -> Decision:
        if not self._open:
            self._finished = True
            self._pending = None
            self._arrived.clear()
            return Finished()
        return self._try_complete()

    def _try_complete(self) -> Decision:
        barrier = self._pending
        if barrier is None or not self._open <= self._arrived:
            return None
        self._pending = None
        self._arrived.clear()
        self._forwarded = barrier.id
        self._aborted = {i for i in self._aborted if i > barrier.id}
        return Forward(barrier)
