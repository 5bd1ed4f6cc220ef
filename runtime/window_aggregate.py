"""Windowed aggregations whose hot keys can be split over several tasks: the two-phase
(local-global) window aggregation of Flink, with TAG's key splitting.

``stream.key_by(k).window_aggregate("hot", Tumbling(10), Count())`` emits the same
:class:`~runtime.windows.WindowResult` ``(key, start, end, value)`` per window as
``window("hot", Tumbling(10), aggregate=Count())``, and compiles to two keyed operators:

- ``hot`` (the *partial* side, :class:`PartialWindow`, combinable like the rolling
  aggregation's of :mod:`runtime.aggregate`): per key part and window an accumulator;
  when the task's watermark passes a window's end, its timer emits the part as a
  :class:`WindowPart` ``(key, start, end, part, acc)`` (``part``: the key group holding
  it), before the task forwards that watermark;
- ``hot.merge`` (:class:`WindowMerge`), keyed by the key: collects the parts of each
  (key, window) and emits their merged result on an event-time timer at the window's
  end. Its watermark is the lowest of its inputs', the partial tasks', each of which sent
  its parts of a window before a watermark past its end: when the timer fires, every
  part has come.

A key lives in one part, its key group, until a plan splits it (``splitKey``, as for the
rolling aggregation): its records are then spread round-robin over several partial tasks,
each keeping its windows in one of its own key groups (under
:class:`~runtime.aggregate.SplitPart` ``(key)`` outside the key's home group, with their
timers), so that a part moves, is checkpointed and restored with its group. Turning a
split off routes the key home again; the parts left elsewhere keep their open windows and
fire them when their task's watermark passes, so nothing is counted twice or lost. A task
that awaits key groups' state (fluid mode) holds its watermark back until they have come
(:mod:`runtime.task`): the parts their timers emit are not behind the merge's watermark.

Lateness (``allowed_lateness_s``, event time, as for ``window``): a record whose windows
closed more than that ago by its partial task's watermark is late (dropped, or sent on as
a :class:`~runtime.windows.LateRecord` with ``late="emit"``, through the merge); one within
it updates its part's accumulator, whose part is sent again at once, and the merge, which
keeps each part's latest accumulator until the same lateness has passed by its own
watermark, emits the window's updated result (at once if it fired already, else when it
does). The last result of each window is the one ``window`` gives, and it is emitted as
many times as ``window`` emits it (once at the close, once per late record) or fewer: a
late record's part that reaches the merge before the merge's watermark passes the
window's end is merged into that one firing. Both sides keep a window until its end plus
the allowed lateness.

Only aligned windows split: ``Tumbling`` and ``Sliding`` on event time, with an
``Aggregate`` whose accumulators merge (:func:`~runtime.aggregate.check_combinable`).
Sessions (merging per key), count windows (ordered per key), full-window ``apply=``
functions and processing time are refused by :func:`check_splittable`, which says to
use ``window`` (results on every record, ``emit="update"``, are ``window``'s only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from .aggregate import SplitPart, check_combinable, merged, snapshot
from .eventtime import RESOLUTION_S
from .timers import KeyContext, KeyedProcessFunction
from .windows import Aggregate, LateRecord, Sliding, Tumbling, WindowLogic, WindowResult

__all__ = ["PartialWindow", "WindowMerge", "WindowPart", "check_splittable"]


class WindowPart(NamedTuple):
    """What the partial side sends the merge: one part's accumulator of a window."""

    key: Any
    start: float
    end: float
    part: int
    acc: Any


def check_splittable(assigner: Any, aggregate: Any, allowed_lateness_s: float, time: str) -> None:
    """Raise ValueError, saying what to use instead, unless a windowed aggregation with
    ``assigner``, ``aggregate`` and ``time`` can split its keys (module docstring)."""
    if not isinstance(assigner, Tumbling | Sliding):
        raise ValueError(
            f"window_aggregate splits aligned windows (Tumbling, Sliding) only, got "
            f"{assigner!r}: its windows need all of a key's records in one task; "
            "use window(...) for it"
        )
    if time != "event":
        raise ValueError(
            f"window_aggregate runs on event time only, got time={time!r}: its merge fires "
            "on the watermark; use window(..., time='processing') for processing time"
        )
    if not isinstance(aggregate, Aggregate):
        raise ValueError(
            f"window_aggregate takes an Aggregate (Count(), Sum(of), ...), got "
            f"{type(aggregate).__name__}: for a function of the window's records use "
            "window(..., apply=fn)"
        )
    check_combinable(aggregate)
    lateness = allowed_lateness_s
    if not isinstance(lateness, int | float) or isinstance(lateness, bool) or lateness < 0:
        raise ValueError(f"window_aggregate: allowed_lateness_s must be >= 0, got {lateness!r}")


def _unsplit(key: Any) -> Any:
    return key.key if type(key) is SplitPart else key


@dataclass(frozen=True)
class PartialWindow(WindowLogic):
    """The partial side's logic: a window's accumulator per key part (the state key is
    the key, or ``SplitPart(key)`` for a split key's part outside its home group), emitted
    as a :class:`WindowPart` where :class:`WindowLogic` would emit its result."""

    def __call__(self, key: Any, record: Any, ctx: KeyContext) -> list | None:
        return self._parts(super().__call__(key, record, ctx), ctx)

    def on_timer(self, key: Any, time: float, ctx: KeyContext) -> list | None:
        return self._parts(super().on_timer(key, time, ctx), ctx)

    def _results(self, key: Any, start: float, end: float, acc: Any) -> list:
        return [WindowResult(key, start, end, snapshot(acc))]  # the accumulator itself

    def _parts(self, out: list | None, ctx: KeyContext) -> list | None:
        if not out:
            return out
        return [
            WindowPart(_unsplit(o.key), o.start, o.end, ctx.group, o.value)
            if type(o) is WindowResult
            else LateRecord(_unsplit(o.key), o.value, o.timestamp)
            for o in out
        ]


@dataclass(frozen=True)
class WindowMerge(KeyedProcessFunction):
    """The merge side's logic, keyed by the key. Its key state: ``(start, end) -> {part:
    accumulator}``, each part's latest; a window's result is emitted when the watermark
    reaches its end (``end - RESOLUTION_S``, as :class:`WindowLogic` does), and again at
    once for a part that comes later (a late record's update); the window is forgotten
    ``allowed_lateness_s`` after its end. Late records pass through."""

    aggregate: Aggregate
    allowed_lateness_s: float = 0.0
    late: Literal["drop", "emit"] = "drop"

    def __call__(self, key: Any, part: Any, ctx: KeyContext) -> list | None:
        if type(part) is LateRecord:
            return [part]
        _key, start, end, index, acc = part
        span = (start, end)
        close = end - RESOLUTION_S
        windows = ctx.get() or {}
        parts = windows.get(span)
        if parts is None:
            parts = windows[span] = {}
            if close > ctx.watermark:
                ctx.timers.register_event_time(close)
            if self.allowed_lateness_s:
                ctx.timers.register_event_time(close + self.allowed_lateness_s)
        parts[index] = acc
        ctx.set(windows)
        if close <= ctx.watermark:  # it fired already: a late record's update
            return [self._result(key, span, parts)]
        return None

    def on_timer(self, key: Any, time: float, ctx: KeyContext) -> list | None:
        windows = ctx.get()
        if not windows:
            return None
        out = []
        for span in sorted(windows):
            close = span[1] - RESOLUTION_S
            if close == time:
                out.append(self._result(key, span, windows[span]))
            if close + self.allowed_lateness_s <= time:
                del windows[span]  # closed and past its lateness: its parts go
        if windows:
            ctx.set(windows)
        else:
            ctx.clear()
        return out

    def _result(self, key: Any, span: tuple[float, float], parts: dict) -> WindowResult:
        agg = self.aggregate
        return WindowResult(key, span[0], span[1], agg.result(merged(agg, parts.values())))
