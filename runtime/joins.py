"""Two keyed streams into one keyed operator: co-process functions, interval joins and
window joins.

``left.key_by(k1).connect(right.key_by(k2))`` is a keyed stream of both inputs: records of
the same key (``k1`` of a left record, ``k2`` of a right one) meet in the same key group,
hence the same task and the same per-key state. Its operator's logic sees which side a
record came from as ``ctx.side`` (:data:`LEFT` or :data:`RIGHT`): a
:class:`CoProcessFunction` gets ``process_left`` and ``process_right`` calls, with timers
and state as any :class:`~runtime.timers.KeyedProcessFunction`.

Two joins are built on it, on event time:

- **Interval join** (:class:`IntervalJoin`): each left record ``l`` pairs with every
  right record ``r`` of its key with ``l.t + lower_s <= r.t <= l.t + upper_s``;
  ``join(l, r)`` is emitted once per pair, as soon as both have come, stamped with the
  time of the record that came second. A record waits in its key's state until the watermark says no partner can come
  (left: ``l.t + upper_s``; right: ``r.t - lower_s``).
- **Window join** (:class:`WindowJoin`): records of both sides fall in the tumbling or
  sliding windows of their time; when a window closes, ``join(l, r)`` is emitted for
  every pair of its key, stamped like a window result.

Records that come late (at or before the watermark, beyond what the join still holds) are
dropped and counted in the task's metrics; with bounded out-of-orderness set right at the
sources there are none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .timers import KeyContext, KeyedProcessFunction
from .windows import RESOLUTION_S, Sliding, Tumbling

__all__ = ["LEFT", "RIGHT", "CoProcessFunction", "IntervalJoin", "Sided", "WindowJoin"]

LEFT, RIGHT = 0, 1


@dataclass(frozen=True, slots=True)
class Sided:
    """The key selector of one side of a connected stream: ``key(record)``, and the side
    (:data:`LEFT` or :data:`RIGHT`) the operator reads its records as."""

    key: Callable[[Any], Any]
    side: int

    def __call__(self, record: Any) -> Any:
        return self.key(record)


class CoProcessFunction(KeyedProcessFunction):
    """Logic of a connected keyed stream: ``process_left(key, record, ctx)`` and
    ``process_right(key, record, ctx)``, each returning an iterable of outputs or None,
    and ``on_timer`` as for any keyed process function."""

    def __call__(self, key: Any, record: Any, ctx: KeyContext) -> Any:
        if ctx.side == LEFT:
            return self.process_left(key, record, ctx)
        return self.process_right(key, record, ctx)

    def process_left(self, key: Any, record: Any, ctx: KeyContext) -> Any:
        raise NotImplementedError

    def process_right(self, key: Any, record: Any, ctx: KeyContext) -> Any:
        raise NotImplementedError


def _check_join(join: Any) -> None:
    if not callable(join):
        raise ValueError(f"join must be a function of (left, right), got {join!r}")


@dataclass(frozen=True)
class IntervalJoin(CoProcessFunction):
    """See the module. Key state: ``[lefts, rights]``, each a dict time -> records."""

    lower_s: float
    upper_s: float
    join: Callable[[Any, Any], Any]

    def __post_init__(self) -> None:
        for name in ("lower_s", "upper_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"interval join: {name} must be a number, got {value!r}")
        if self.lower_s > self.upper_s:
            raise ValueError(
                f"interval join: lower_s ({self.lower_s}) must not exceed upper_s ({self.upper_s})"
            )
        _check_join(self.join)

    def pairs(self, left_t: float, right_t: float) -> bool:
        """Whether records at these times pair (the one test both sides use)."""
        return left_t + self.lower_s <= right_t <= left_t + self.upper_s

    def __call__(self, key: Any, record: Any, ctx: KeyContext) -> list | None:
        t, side = ctx.timestamp, ctx.side
        # Beyond this, no partner of the record can come: it leaves the state then (a
        # microsecond later, so that rounding cannot drop a pair at the edge).
        until = (t + self.upper_s if side == LEFT else t - self.lower_s) + RESOLUTION_S
        if until <= ctx.watermark:
            ctx.late += 1
            return None
        buffers = ctx.get() or [{}, {}]
        join, pairs = self.join, self.pairs
        if side == LEFT:
            out = [join(record, r) for rt, rs in buffers[RIGHT].items() if pairs(t, rt) for r in rs]
        else:
            out = [
                join(lf, record) for lt, ls in buffers[LEFT].items() if pairs(lt, t) for lf in ls
            ]
        kept = buffers[side].setdefault(t, [])
        if not kept:
            ctx.timers.register_event_time(until)
        kept.append(record)
        ctx.set(buffers)
        return out

    def on_timer(self, key: Any, time: float, ctx: KeyContext) -> None:
        buffers = ctx.get()
        if buffers is None:
            return
        lefts, rights = buffers
        for t in [t for t in lefts if t + self.upper_s + RESOLUTION_S <= time]:
            del lefts[t]
        for t in [t for t in rights if t - self.lower_s + RESOLUTION_S <= time]:
            del rights[t]
        ctx.set(buffers) if lefts or rights else ctx.clear()


@dataclass(frozen=True)
class WindowJoin(CoProcessFunction):
    """See the module. Key state: ``{(start, end): [lefts, rights]}``."""

    assigner: Tumbling | Sliding
    join: Callable[[Any, Any], Any]

    def __post_init__(self) -> None:
        if not isinstance(self.assigner, Tumbling | Sliding):
            raise ValueError(
                f"window join: the assigner must be Tumbling or Sliding, got {self.assigner!r}"
            )
        _check_join(self.join)

    def __call__(self, key: Any, record: Any, ctx: KeyContext) -> None:
        windows = ctx.get() or {}
        late = True
        for span in self.assigner.assign(ctx.timestamp):
            close = span[1] - RESOLUTION_S
            if close <= ctx.watermark:
                continue
            late = False
            sides = windows.get(span)
            if sides is None:
                sides = windows[span] = [[], []]
                ctx.timers.register_event_time(close)
            sides[ctx.side].append(record)
        if late:
            ctx.late += 1
            return
        ctx.set(windows)

    def on_timer(self, key: Any, time: float, ctx: KeyContext) -> list:
        windows = ctx.get() or {}
        out = []
        for span in sorted(windows):
            if span[1] - RESOLUTION_S <= time:
                lefts, rights = windows.pop(span)
                out += [self.join(left, right) for left in lefts for right in rights]
        ctx.set(windows) if windows else ctx.clear()
        return out
