"""Windows on a keyed stream: tumbling, sliding, session and count windows.

``stream.key_by(k).window("name", Tumbling(60), aggregate=Count())`` adds a keyed operator
(:class:`WindowLogic`, a :class:`~runtime.timers.KeyedProcessFunction`) that puts each
record in its key's windows and emits a :class:`WindowResult` ``(key, start, end,
value)`` per window when it closes. Windows hold an accumulator, not their records, when
given an :class:`Aggregate` (``aggregate=``: incremental); a full-window function
(``apply=fn(key, start, end, records)`` returning an iterable) keeps the records.

Time. On event time (the default; the source needs an
:class:`~runtime.eventtime.EventTime`), a window ``[start, end)`` closes when the watermark
reaches ``end - RESOLUTION_S`` (every record before ``end`` has come), and its result is
stamped ``end - RESOLUTION_S``, so that a window of the same size downstream puts it in
the window it closes. On processing time (``time="processing"``) records fall in windows
by the wall clock when they are processed, and windows close by it. When a bounded job's
input ends, every window still open closes.

Lateness. A record is *late* when every window it falls in has closed more than
``allowed_lateness_s`` ago (by the watermark); for sessions, the one it merges into (as
Flink merges first: a record whose own ``[t, t + gap_s)`` is that old still joins a
session kept within its lateness). Late records are dropped, counted in the
task's metrics (``event_time.late``), or with ``late="emit"`` sent on as
:class:`LateRecord` (select them with :func:`is_late`). A record that comes after its
window closed but within the allowed lateness updates the window, and its result is
emitted again at once; the window's state is kept until then. One that opens a window
closed already (no state for it yet) emits it at once and only then: no timer fires it
again at its close (Flink's ``EventTimeTrigger``). A late record that merges sessions
emits the merged one at once if it has closed, else when it closes.

Emission. ``emit="close"`` (default): a window's result when it closes, and once more
for each record within the allowed lateness that comes after that: with no lateness,
one result per window. ``emit="update"``: the window's current result after each record
(stamped with the record's time), and nothing more when it closes.

Windows are keyed state with their timers (:mod:`runtime.timers`): they move with their
key groups in a live reconfiguration and are part of checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from .eventtime import RESOLUTION_S
from .timers import KeyContext, KeyedProcessFunction

__all__ = [
    "RESOLUTION_S",
    "Aggregate",
    "Collect",
    "Count",
    "CountWindow",
    "LateRecord",
    "Max",
    "Mean",
    "Min",
    "Reduce",
    "Session",
    "Sliding",
    "Sum",
    "Tumbling",
    "WindowLogic",
    "WindowResult",
    "is_late",
]


class WindowResult(NamedTuple):
    """What a window emits: its key, its bounds ``[start, end)`` and its value."""

    key: Any
    start: float
    end: float
    value: Any


class LateRecord(NamedTuple):
    """A record that came after every window it falls in had closed (``late="emit"``)."""

    key: Any
    value: Any
    timestamp: float


def is_late(record: Any) -> bool:
    """Whether ``record`` is a :class:`LateRecord` (for ``filter``)."""
    return type(record) is LateRecord


def _positive(owner: str, name: str, value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{owner}({name}=...) must be a number > 0, got {value!r}")
    return float(value)


# -- assigners -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tumbling:
    """Windows of ``size_s`` seconds, one after the other, aligned on ``offset_s``."""

    size_s: float
    offset_s: float = 0.0

    def __post_init__(self) -> None:
        _positive("Tumbling", "size_s", self.size_s)

    def assign(self, t: float) -> list[tuple[float, float]]:
        start = math.floor((t - self.offset_s) / self.size_s) * self.size_s + self.offset_s
        return [(start, start + self.size_s)]


@dataclass(frozen=True)
class Sliding:
    """Windows of ``size_s`` seconds starting every ``slide_s`` (hopping windows): a
    record falls in ``size_s / slide_s`` of them."""

    size_s: float
    slide_s: float
    offset_s: float = 0.0

    def __post_init__(self) -> None:
        _positive("Sliding", "size_s", self.size_s)
        _positive("Sliding", "slide_s", self.slide_s)
        if self.slide_s > self.size_s:
            raise ValueError(
                f"Sliding(slide_s={self.slide_s}) must not exceed size_s={self.size_s} "
                "(records would fall between windows)"
            )

    def assign(self, t: float) -> list[tuple[float, float]]:
        size, slide = self.size_s, self.slide_s
        last = math.floor((t - self.offset_s) / slide) * slide + self.offset_s
        out = []
        start = last
        while start > t - size:
            out.append((start, start + size))
            start -= slide
        return out


@dataclass(frozen=True)
class Session:
    """Windows of activity per key: a record opens ``[t, t + gap_s)``, and windows that
    overlap merge (half-open: records exactly ``gap_s`` apart are in two sessions); a
    session closes after ``gap_s`` without records of its key."""

    gap_s: float

    def __post_init__(self) -> None:
        _positive("Session", "gap_s", self.gap_s)

    def assign(self, t: float) -> list[tuple[float, float]]:
        return [(t, t + self.gap_s)]


@dataclass(frozen=True)
class CountWindow:
    """Windows of ``size`` records per key, one after the other: window ``i`` of a key
    holds its records ``i * size`` to ``(i + 1) * size - 1`` (in the order its task
    processed them) and closes with its last; ``start`` and ``end`` are those counts."""

    size: int

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise ValueError(f"CountWindow(size=...) must be an int >= 1, got {self.size!r}")


Assigner = Tumbling | Sliding | Session | CountWindow


# -- aggregates ------------------------------------------------------------------------------


class Aggregate:
    """An incremental aggregation: ``create()`` an accumulator, ``add(acc, record)``,
    ``merge(a, b)`` two accumulators (session windows merge), ``result(acc)``. Each
    returns the new accumulator (which may be the one given, changed in place)."""

    def create(self) -> Any:
        raise NotImplementedError

    def add(self, acc: Any, record: Any) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} cannot merge: no session windows")

    def result(self, acc: Any) -> Any:
        return acc


def _of(of: Callable | None, record: Any) -> Any:
    return record if of is None else of(record)


@dataclass(frozen=True)
class Count(Aggregate):
    """How many records."""

    def create(self) -> int:
        return 0

    def add(self, acc: int, record: Any) -> int:
        return acc + 1

    def merge(self, a: int, b: int) -> int:
        return a + b


@dataclass(frozen=True)
class Sum(Aggregate):
    """The sum of ``of(record)`` (the record itself by default)."""

    of: Callable[[Any], Any] | None = None

    def create(self) -> Any:
        return 0

    def add(self, acc: Any, record: Any) -> Any:
        return acc + _of(self.of, record)

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


@dataclass(frozen=True)
class Min(Aggregate):
    """The least ``of(record)``."""

    of: Callable[[Any], Any] | None = None

    def create(self) -> Any:
        return None

    def add(self, acc: Any, record: Any) -> Any:
        v = _of(self.of, record)
        return v if acc is None or v < acc else acc

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else min(a, b)


@dataclass(frozen=True)
class Max(Aggregate):
    """The greatest ``of(record)``."""

    of: Callable[[Any], Any] | None = None

    def create(self) -> Any:
        return None

    def add(self, acc: Any, record: Any) -> Any:
        v = _of(self.of, record)
        return v if acc is None or v > acc else acc

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else max(a, b)


@dataclass(frozen=True)
class Mean(Aggregate):
    """The mean of ``of(record)``."""

    of: Callable[[Any], Any] | None = None

    def create(self) -> tuple[float, int]:
        return (0.0, 0)

    def add(self, acc: tuple[float, int], record: Any) -> tuple[float, int]:
        return (acc[0] + _of(self.of, record), acc[1] + 1)

    def merge(self, a: tuple[float, int], b: tuple[float, int]) -> tuple[float, int]:
        return (a[0] + b[0], a[1] + b[1])

    def result(self, acc: tuple[float, int]) -> float | None:
        return acc[0] / acc[1] if acc[1] else None


@dataclass(frozen=True)
class Reduce(Aggregate):
    """``fn(a, b)`` folded over the records (the first record starts it); merge applies it
    to the two results."""

    fn: Callable[[Any, Any], Any]

    def create(self) -> Any:
        return _EMPTY

    def add(self, acc: Any, record: Any) -> Any:
        return record if acc == _EMPTY else self.fn(acc, record)

    def merge(self, a: Any, b: Any) -> Any:
        return b if a == _EMPTY else a if b == _EMPTY else self.fn(a, b)

    def result(self, acc: Any) -> Any:
        return None if acc == _EMPTY else acc


_EMPTY = ("streampilot.windows.empty",)  # a Reduce before its first record (a plain tuple)


@dataclass(frozen=True)
class Collect(Aggregate):
    """The window's records, as a list (what a full-window function gets)."""

    def create(self) -> list:
        return []

    def add(self, acc: list, record: Any) -> list:
        acc.append(record)
        return acc

    def merge(self, a: list, b: list) -> list:
        return a + b


# -- the operator -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowLogic(KeyedProcessFunction):
    """The keyed logic of a window operator (built by ``KeyedStream.window``; see the
    module). Its key state: a dict ``(start, end) -> accumulator`` (count windows: the
    records counted so far and the accumulator)."""

    assigner: Assigner
    aggregate: Aggregate | None = None
    apply: Callable[[Any, float, float, list], Any] | None = None
    allowed_lateness_s: float = 0.0
    late: Literal["drop", "emit"] = "drop"
    emit: Literal["close", "update"] = "close"
    time: Literal["event", "processing"] = "event"

    def __post_init__(self) -> None:
        if not isinstance(self.assigner, Tumbling | Sliding | Session | CountWindow):
            raise ValueError(
                "window: the assigner must be Tumbling, Sliding, Session or CountWindow, got "
                f"{self.assigner!r}"
            )
        if (self.aggregate is None) == (self.apply is None):
            raise ValueError("window: give exactly one of aggregate=... and apply=...")
        if self.aggregate is not None and not isinstance(self.aggregate, Aggregate):
            raise ValueError(
                f"window: aggregate must be a runtime.windows.Aggregate, got {self.aggregate!r}"
            )
        if self.apply is not None and not callable(self.apply):
            raise ValueError(f"window: apply must be callable, got {self.apply!r}")
        lateness = self.allowed_lateness_s
        if not isinstance(lateness, int | float) or isinstance(lateness, bool) or lateness < 0:
            raise ValueError(f"window: allowed_lateness_s must be >= 0, got {lateness!r}")
        if self.late not in ("drop", "emit"):
            raise ValueError(f"window: late must be 'drop' or 'emit', got {self.late!r}")
        if self.emit not in ("close", "update"):
            raise ValueError(f"window: emit must be 'close' or 'update', got {self.emit!r}")
        if self.time not in ("event", "processing"):
            raise ValueError(f"window: time must be 'event' or 'processing', got {self.time!r}")
        if self.time == "processing" and lateness:
            raise ValueError("window: allowed_lateness_s applies to event time only")
        if isinstance(self.assigner, Session) and self.aggregate is not None:
            try:  # merge must be there: sessions merge their accumulators
                type(self.aggregate).merge  # noqa: B018
            except AttributeError:
                raise ValueError("window: session windows need an aggregate with merge") from None

    # The accumulator: the aggregate's, or the records for a full-window function.
    def _create(self) -> Any:
        return [] if self.aggregate is None else self.aggregate.create()

    def _add(self, acc: Any, record: Any) -> Any:
        if self.aggregate is None:
            acc.append(record)
            return acc
        return self.aggregate.add(acc, record)

    def _merge(self, a: Any, b: Any) -> Any:
        return a + b if self.aggregate is None else self.aggregate.merge(a, b)

    def _results(self, key: Any, start: float, end: float, acc: Any) -> list:
        if self.aggregate is not None:
            return [WindowResult(key, start, end, self.aggregate.result(acc))]
        out = self.apply(key, start, end, list(acc))
        return list(out) if out else []

    def __call__(self, key: Any, record: Any, ctx: KeyContext) -> list | None:
        if isinstance(self.assigner, CountWindow):
            return self._count(key, record, ctx)
        event = self.time == "event"
        t = ctx.timestamp if event else ctx.processing_time
        windows = ctx.get()
        if windows is None:
            windows = {}
        lateness = self.allowed_lateness_s if event else 0.0
        fired_before = ctx.watermark if event else -math.inf
        out: list = []
        spans = self.assigner.assign(t)
        if isinstance(self.assigner, Session):  # late or not by the merged session (Flink's)
            spans = [self._merge_session(windows, spans[0], ctx)]
        if event and all(end - RESOLUTION_S + lateness <= ctx.watermark for _, end in spans):
            return self._late(key, record, t, ctx)  # (a session it merged with would not be)
        for span in spans:
            start, end = span
            if event and end - RESOLUTION_S + lateness <= ctx.watermark:
                continue  # this one is gone; the record counts in the others
            new = span not in windows
            acc = windows[span] = self._add(windows[span] if not new else self._create(), record)
            if new:
                self._schedule(end, ctx)
            if self.emit == "update" or (event and end - RESOLUTION_S <= fired_before):
                out += self._results(key, start, end, acc)  # an update, or a late firing
        ctx.set(windows)
        return out

    def _schedule(self, end: float, ctx: KeyContext) -> None:
        """Register the timers of a window ending at ``end``: its close, unless the
        watermark has passed it (a late firing, emitted by the caller at once: as Flink's
        ``EventTimeTrigger.onElement`` fires at once and registers no timer), and its
        cleanup at the close plus the allowed lateness."""
        if self.time == "processing":
            ctx.timers.register_processing_time(end)
            return
        for t in self._event_times(end):
            if t > ctx.watermark:
                ctx.timers.register_event_time(t)

    def _merge_session(
        self, windows: dict, span: tuple[float, float], ctx: KeyContext
    ) -> tuple[float, float]:
        """Merge ``span`` with the key's sessions it overlaps; returns the merged span,
        whose accumulator (the merged ones') is in ``windows``; the timers of the
        sessions merged away are deleted."""
        start, end = span
        acc = None
        for other in sorted(windows):
            o_start, o_end = other
            if o_start < end and start < o_end:  # they overlap (half-open: touching do not)
                start, end = min(start, o_start), max(end, o_end)
                o_acc = windows.pop(other)
                acc = o_acc if acc is None else self._merge(acc, o_acc)
                self._unschedule(o_end, windows, ctx)
        if acc is not None:  # its sessions are one now, closing at the merged end
            windows[(start, end)] = acc
            self._schedule(end, ctx)
        return (start, end)

    def _unschedule(self, end: float, windows: dict, ctx: KeyContext) -> None:
        """Delete the timers of a session ending at ``end``, merged away, but those that
        the key's other ``windows`` still need: timers are per key and time, and one
        session's cleanup may be another's close."""
        if self.time == "processing":
            ctx.timers.delete_processing_time(end)  # sessions apart end apart
            return
        needed = {t for _, o_end in windows for t in self._event_times(o_end)}
        for t in self._event_times(end):
            if t not in needed:
                ctx.timers.delete_event_time(t)

    def _event_times(self, end: float) -> tuple[float, ...]:
        """The event-time timers of a window ending at ``end``: its close and cleanup."""
        close = end - RESOLUTION_S
        lateness = self.allowed_lateness_s
        return (close, close + lateness) if lateness else (close,)

    def _late(self, key: Any, record: Any, t: float, ctx: KeyContext) -> list | None:
        ctx.late += 1
        return [LateRecord(key, record, t)] if self.late == "emit" else None

    def _count(self, key: Any, record: Any, ctx: KeyContext) -> list | None:
        size = self.assigner.size  # type: ignore[union-attr]
        state = ctx.get()
        seen, acc = state if state is not None else (0, self._create())
        acc = self._add(acc, record)
        seen += 1
        start = (seen - 1) // size * size
        if seen % size == 0:
            ctx.set((seen, self._create()))
            return self._results(key, start, start + size, acc)
        ctx.set((seen, acc))
        if self.emit == "update":
            return self._results(key, start, start + size, acc)
        return None

    def on_timer(self, key: Any, time: float, ctx: KeyContext) -> list | None:
        windows = ctx.get()
        if not windows:
            return None
        out: list = []
        lateness = self.allowed_lateness_s if self.time == "event" else 0.0
        for span in sorted(windows):
            start, end = span
            close = end if self.time == "processing" else end - RESOLUTION_S
            if close == time and self.emit == "close":
                out += self._results(key, start, end, windows[span])
            if close + lateness <= time:
                del windows[span]  # closed and past its lateness: its state goes
        if windows:
            ctx.set(windows)
        else:
            ctx.clear()
        return out
