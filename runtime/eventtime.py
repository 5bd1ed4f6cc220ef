"""Event time: timestamps assigned at the sources, and watermarks that say how far it got.

A source given an :class:`EventTime` stamps each record with its event time (the
record's field or a function of it, in seconds since the epoch) instead of the time it
was read, and its tasks send **watermarks** downstream, in band with the records, like
barriers: a watermark ``W`` on a channel promises that no record stamped ``<= W`` follows
it there (records that break the promise are *late*). Without event time a record's
timestamp is the time its source emitted it (ingestion time) and no watermark flows.

Two pure state machines, driven by the task loops (:mod:`runtime.task`):

- :class:`SourceClock`, one per source task: per split it reads (a partition, or the
  task's share of an unpartitioned source) the highest event time seen; the split's
  watermark is that minus the source's bounded out-of-orderness (and a microsecond, so
  that a record exactly that far behind is on time), and the task's is the lowest over
  its active splits. A split that has sent nothing for ``idle_timeout_s`` is
  *idle* and does not hold time back; when every split is idle the task says so (an
  idle watermark), and downstream tasks leave it out until it sends records again.
- :class:`WatermarkTracker`, one per task with inputs: the last watermark of each input
  channel; the task's watermark is the lowest over its inputs that are neither idle nor
  ended, and it only moves forward. When it moves, the task fires its event-time timers
  up to it (:mod:`runtime.timers`) and forwards it.

A bounded source's task that reaches its end sends the final watermark (``inf``), which
closes every window and fires every event-time timer downstream before end of stream.

Reconfiguration. A partition can move from a source task whose watermark it held back to
one that has announced a later watermark already: its next records would be late there.
So watermarks are re-announced across every reconfiguration barrier: a source task that
emitted one sends the watermark of the splits it reads now, even if lower than before;
a task that forwarded one forgets what its inputs said before it
(:meth:`WatermarkTracker.reset`) and forwards nothing until each has spoken again, then
the lowest, even if lower than before. Its event-time timers never go back
(:attr:`WatermarkTracker.current`): a keyed task reads every upstream task, so the
partition's old task held its watermark back until the barrier. Channels added by a
reconfiguration start with no watermark until their sender speaks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .records import Watermark

__all__ = [
    "NO_WATERMARK",
    "RESOLUTION_S",
    "EventTime",
    "EventTimeError",
    "SourceClock",
    "WatermarkTracker",
    "record_time",
]

NO_WATERMARK = -math.inf  # what a task knows before any watermark came
RESOLUTION_S = 1e-6  # event times are taken at microseconds (a watermark W says: none <= W)
WATERMARK_INTERVAL_S = 0.2  # a source task sends its watermark at most this often


class EventTimeError(ValueError):
    """A record whose event time cannot be read: the message names the record."""


@dataclass(frozen=True)
class EventTime:
    """How a source's records carry event time.

    ``timestamp``: the name of the record's field (an attribute, or a key of a dict
    record) or a picklable function of the record, giving seconds since the epoch (an int
    or float; ``per_second`` divides it first: 1000 for milliseconds).
    ``max_out_of_orderness_s``: how far behind the highest event time seen in a split a
    record may come and still be on time (the watermark trails by this much).
    ``idle_timeout_s``: a split that has sent nothing for this long stops holding the
    watermark back (None: never idle).
    """

    timestamp: str | Callable[[Any], float]
    max_out_of_orderness_s: float = 0.0
    idle_timeout_s: float | None = None
    per_second: float = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.timestamp, str) and self.timestamp) and not callable(
            self.timestamp
        ):
            raise ValueError(
                "EventTime(timestamp=...) must name a field of the records or be a function "
                f"of a record, got {self.timestamp!r}"
            )
        bound = self.max_out_of_orderness_s
        if not isinstance(bound, int | float) or isinstance(bound, bool) or bound < 0:
            raise ValueError(f"EventTime(max_out_of_orderness_s=...) must be >= 0, got {bound!r}")
        idle = self.idle_timeout_s
        if idle is not None and (
            not isinstance(idle, int | float) or isinstance(idle, bool) or idle <= 0
        ):
            raise ValueError(f"EventTime(idle_timeout_s=...) must be > 0 or None, got {idle!r}")
        unit = self.per_second
        if not isinstance(unit, int | float) or isinstance(unit, bool) or not unit > 0:
            raise ValueError(f"EventTime(per_second=...) must be > 0, got {unit!r}")

    def stamps(self, values: Sequence) -> list[float]:
        """The event time of each record of ``values``; :class:`EventTimeError` names a
        record that has none."""
        ts, unit = self.timestamp, self.per_second
        try:
            if callable(ts):
                out = [float(ts(v)) for v in values]
            else:
                out = [float(record_time(v, ts)) for v in values]
        except Exception as exc:
            bad = next((v for v in values if not _has_time(self, v)), None)
            raise EventTimeError(
                f"record {_short(bad)} has no event time ({type(exc).__name__}: {exc}); "
                f"fix the source's EventTime(timestamp={_describe(ts)})"
            ) from exc
        if unit != 1:
            out = [t / unit for t in out]  # divided, not scaled: ms / 1000 is exact when it can be
        return out


def record_time(record: Any, field: str) -> Any:
    """``record[field]`` for a mapping, else ``getattr(record, field)``."""
    if isinstance(record, dict):
        return record[field]
    return getattr(record, field)


def _has_time(spec: EventTime, record: Any) -> bool:
    try:
        ts = spec.timestamp
        float(ts(record) if callable(ts) else record_time(record, ts))
    except Exception:
        return False
    return True


def _describe(ts: Any) -> str:
    return repr(ts) if isinstance(ts, str) else getattr(ts, "__qualname__", repr(ts))


def _short(obj: Any, limit: int = 200) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[:limit] + "..."


class SourceClock:
    """The watermark of one source task, from the event times of the splits it reads.

    Pure: the caller passes wall-clock ``now`` (for idleness) to each method.
    """

    def __init__(self, spec: EventTime, splits: Iterable[Hashable] = ()) -> None:
        self.spec = spec
        self._max: dict[Hashable, float] = {}  # split -> highest event time seen
        self._last: dict[Hashable, float] = {}  # split -> when it last sent a record
        self._ended: set[Hashable] = set()
        self.emitted = NO_WATERMARK  # the last watermark sent (never goes back)
        self.idle = False  # the last thing sent said the task is idle
        self._due = 0.0  # when the watermark may be sent again
        for s in splits:
            self.add(s, 0.0)

    def add(self, split: Hashable, now: float) -> None:
        """Read ``split`` from now on (nothing seen of it yet: it holds time back until it
        sends a record or turns idle)."""
        self._max.setdefault(split, NO_WATERMARK)
        self._last.setdefault(split, now)
        self._ended.discard(split)

    def remove(self, split: Hashable) -> None:
        """``split`` is read elsewhere from now on."""
        self._max.pop(split, None)
        self._last.pop(split, None)
        self._ended.discard(split)

    def end(self, split: Hashable) -> None:
        """``split`` is exhausted: it holds nothing back any more."""
        self._ended.add(split)

    def observe(self, split: Hashable, stamps: Sequence[float], now: float) -> None:
        """``split`` sent records with event times ``stamps``."""
        if not stamps:
            return
        self._last[split] = now
        top = max(stamps)
        if top > self._max.get(split, NO_WATERMARK):
            self._max[split] = top

    def watermark(self, now: float) -> float | None:
        """The task's watermark at ``now``: the lowest over its active splits of their
        highest event time less the bound; None when every split is idle (or the task
        reads none and its source is unbounded)."""
        idle_after = self.spec.idle_timeout_s
        bound = self.spec.max_out_of_orderness_s
        lowest = math.inf
        active = False
        for split, top in self._max.items():
            if split in self._ended:
                continue
            if idle_after is not None and now - self._last[split] >= idle_after:
                continue
            active = True
            lowest = min(lowest, top - bound - RESOLUTION_S)  # a record at the bound is on time
        if not active:
            return math.inf if self._max and self._all_ended() else None
        return lowest

    def _all_ended(self) -> bool:
        return all(s in self._ended for s in self._max)

    def due(self, now: float) -> Watermark | None:
        """What to send now, at most every :data:`WATERMARK_INTERVAL_S`: a watermark
        higher than the last one sent, an idle mark when every split turned idle, or an
        active mark (the last watermark) when records come again after an idle mark."""
        if now < self._due:
            return None
        self._due = now + WATERMARK_INTERVAL_S
        return self._next(now)

    def before_records(self) -> Watermark | None:
        """Records are about to be sent: if the last mark said idle, say active first."""
        if not self.idle:
            return None
        self.idle = False
        return Watermark(self.emitted)

    def _next(self, now: float) -> Watermark | None:
        wm = self.watermark(now)
        if wm is None:
            if self.idle:
                return None
            self.idle = True
            return Watermark(self.emitted, idle=True)
        if wm > self.emitted or self.idle:
            self.emitted = max(wm, self.emitted)
            self.idle = False
            return Watermark(self.emitted)
        return None

    def reset(self) -> None:
        """The task emitted a reconfiguration's barrier (partitions may have come or gone):
        send the watermark of what it reads now at once, even if lower than the last."""
        self.emitted = NO_WATERMARK
        self.idle = False
        self._due = 0.0

    def final(self) -> Watermark:
        """The source ended: event time is over."""
        self.emitted = math.inf
        self.idle = False
        return Watermark(math.inf)


class WatermarkTracker:
    """The watermark of a task with inputs: the lowest over its inputs that are neither
    idle nor ended. Inputs added later start without a watermark (see the module).

    Two values: :attr:`current`, up to which the task's event-time timers have fired,
    never goes back; :attr:`forwarded`, the last watermark the task sent, does not
    either, except across a reconfiguration (:meth:`reset`)."""

    def __init__(self, inputs: Iterable[Hashable] = ()) -> None:
        self._wm: dict[Hashable, float] = {}
        self._idle: set[Hashable] = set()
        self.current = NO_WATERMARK  # the highest watermark the task has had
        self.forwarded = NO_WATERMARK  # the last it sent
        self.idle = False  # the task said idle downstream
        self.seen = False  # some input sent a watermark: this job runs on event time
        for key in inputs:
            self.add_input(key)

    def add_input(self, key: Hashable) -> None:
        self._wm.setdefault(key, NO_WATERMARK)

    def remove_input(self, key: Hashable) -> Watermark | None:
        """``key`` is gone (ended or removed by a reconfiguration)."""
        self._wm.pop(key, None)
        self._idle.discard(key)
        return self._advance()

    def refresh(self) -> Watermark | None:
        """What to forward after inputs were added or removed (see :meth:`on_watermark`)."""
        return self._advance()

    def reset(self) -> None:
        """The task forwarded a reconfiguration's barrier: what each input says from now
        on replaces what it said before, lower or not, and nothing is forwarded until
        every input has spoken again (each re-announces after the barrier). A partition
        that moved from one source task to another is then counted where it is now,
        never in neither (see the module)."""
        for key in self._wm:
            self._wm[key] = NO_WATERMARK
        self._idle.clear()
        self.forwarded = NO_WATERMARK
        self.idle = False

    def reannounce(self) -> Watermark | None:
        """The task emitted a reconfiguration's barrier it did not align (a fluid stage
        starting here): what to send again, as if nothing had been sent."""
        self.forwarded = NO_WATERMARK
        self.idle = False
        return self._advance()

    def on_watermark(self, key: Hashable, mark: Watermark) -> Watermark | None:
        """Input ``key`` delivered ``mark``; returns what the task must forward, if
        anything: a higher watermark, or an idle / active mark."""
        self.seen = True
        if mark.idle:
            self._idle.add(key)
        else:
            self._idle.discard(key)
            if mark.time > self._wm.get(key, NO_WATERMARK):
                self._wm[key] = mark.time
        return self._advance()

    def _advance(self) -> Watermark | None:
        if not self.seen:
            return None
        active = [w for k, w in self._wm.items() if k not in self._idle]
        if not active:
            if not self._wm or self.idle:
                return None
            self.idle = True
            return Watermark(self.forwarded, idle=True)
        low = min(active)
        if low > self.forwarded or self.idle:
            self.forwarded = max(low, self.forwarded)
            self.current = max(self.current, self.forwarded)
            self.idle = False
            return Watermark(self.forwarded)
        return None
