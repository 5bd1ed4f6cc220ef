"""The keyed processor of logic with timers (:mod:`runtime.timers`): windows, joins and
user :class:`~runtime.timers.KeyedProcessFunction` s.

It runs like :class:`~runtime.operators.KeyedProcessor` (key groups, fluid arrivals,
change tracking for checkpoints and copies made ahead) and also:

1. binds a :class:`~runtime.timers.KeyContext` per call: the record's timestamp, the
   task's watermark and the wall clock;
2. keeps, per time domain, a heap of (time, key group) over the timer tables of the groups
   it owns; a group that came from elsewhere (a new tenure in
   :attr:`runtime.state.KeyedState.arrivals`) has its table indexed before timers fire;
3. on a higher watermark (:meth:`on_watermark`) fires the event-time timers due, in time
   order; when the wall clock passes :attr:`wakeup` (:meth:`on_processing_time`) fires
   the processing-time ones;
4. a key group whose state arrives in fluid mode has its waiting records processed first,
   each seeing the watermark it came under (not a later one: it was on time when it
   came), then its timers due by then fired;
5. at the end of its input, fires every timer left, event time first;
6. the partial side of a windowed aggregation (:mod:`runtime.window_aggregate`) being
   combinable, a record of a split key goes to the part this task holds
   (:meth:`~runtime.operators.KeyedProcessor.split_part`), under its state key there
   (``SplitPart(key)`` outside the key's home group), which is also the key its logic is
   called with and its timers are registered for.

A heap entry whose group left, or whose time no longer holds a timer, is skipped; so is
one of a group being given away while the task runs (fluid): records of it go to the new
owner from the barrier on, so only there can its timers fire on everything.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from typing import Any

from ..dataflow import OperatorSpec
from ..metrics import TaskMetrics
from ..partitioning import Outputs
from ..state import KeyedState, KeyGroupNotOwnedError
from ..timers import TIMERS, KeyContext, TimerService, TimerTable
from .basic import KeyedProcessor, UserCodeError, _short

__all__ = ["TimedKeyedProcessor"]


class TimedKeyedProcessor(KeyedProcessor):
    """A keyed processor whose logic has ``on_timer`` (see the module)."""

    def __init__(
        self,
        task_id: str,
        op: OperatorSpec,
        outputs: Outputs,
        metrics: TaskMetrics,
        state: KeyedState,
    ) -> None:
        super().__init__(task_id, op, outputs, metrics, state)
        self.ctx = KeyContext(TimerService(self))
        self.watermark = -math.inf
        self.wakeup = math.inf  # the earliest processing-time timer (wall clock)
        self._heaps: tuple[list, list] = ([], [])  # event, processing: (time, group)
        self._indexed: dict[int, int] = {}  # group -> the tenure its table was indexed for
        self._group = -1  # the group of the current call
        self._store: dict | None = None

    # -- what a call does through its context ------------------------------------------

    def register(self, processing: bool, t: float) -> None:
        store, g, key = self._store, self._group, self.ctx._key
        table = store.get(TIMERS)
        if table is None:
            table = store[TIMERS] = TimerTable()
        times = table.processing if processing else table.event
        keys = times.get(t)
        if keys is None:
            keys = times[t] = {}
            heapq.heappush(self._heaps[processing], (t, g))
            if processing and t < self.wakeup:
                self.wakeup = t
        keys[key] = None
        self._changed(g, TIMERS)

    def delete(self, processing: bool, t: float) -> None:
        store, g = self._store, self._group
        table = store.get(TIMERS)
        times = None if table is None else (table.processing if processing else table.event)
        keys = None if times is None else times.get(t)
        if keys is None or self.ctx._key not in keys:
            return
        del keys[self.ctx._key]
        if not keys:
            del times[t]
        if not table:
            del store[TIMERS]
        self._changed(g, TIMERS)

    def _changed(self, g: int, key: Any) -> None:
        if self.changed is not None:
            self.changed[g].add(key)
        touched = self.touched.get(g)
        if touched is not None:
            touched.add(key)

    # -- records ---------------------------------------------------------------------------

    def process(self, key_fn: Any, values: Sequence, stamps: Sequence[float]) -> None:
        kg_of = self.key_group
        cached = kg_of.cache.get
        groups = self.state.groups()
        awaiting = self.awaiting
        splits = self.splits
        counts = self.metrics.key_group_counts
        ctx = self.ctx
        ctx.watermark = self.watermark
        ctx.processing_time = time.time()
        ctx.in_processing_time = False
        side = ctx.side = getattr(key_fn, "side", 0)
        out_v: list = []
        out_t: list = []
        v = k = None
        try:
            for v, t in zip(values, stamps, strict=True):
                k = key_fn(v)
                try:
                    g = cached(k)
                except TypeError:  # unhashable: the hasher names the key type
                    g = None
                if g is None:
                    g = kg_of(k)
                sk = k
                if splits:  # a split key's part: its own state key, in its own group
                    parts = splits.get(k)
                    if parts is not None:
                        g, sk = self.split_part(k, g, parts)
                store = groups.get(g)
                if store is None:
                    waiting = awaiting.get(g)
                    if waiting is None:
                        raise KeyGroupNotOwnedError(self.task_id, g)
                    # Its state is on its way: it waits, with the watermark it came under.
                    waiting.append((sk, v, t, side, self.watermark))
                    continue
                counts[g] += 1
                self._call(g, store, sk, v, t, out_v, out_t)
        except KeyGroupNotOwnedError as exc:
            raise UserCodeError(f"{exc.args[0]} (record {_short(v)}, key {_short(k)})") from exc
        except UserCodeError:
            raise
        except Exception as exc:
            raise self._fail(exc, v, k, keyed=True) from exc
        self._count_late()
        self.outputs.emit(out_v, out_t)

    def _call(self, g: int, store: dict, k: Any, v: Any, t: float, out_v: list, out_t: list):
        self._changed(g, k)
        ctx = self.ctx
        ctx._store = self._store = store
        ctx._key = k
        ctx.timestamp = t
        ctx.group = self._group = g
        r = self.fn(k, v, ctx)
        if r:
            for o in r:
                out_v.append(o)
                out_t.append(t)

    def arrive(self, group: int, data: Any) -> None:
        self.state.take_in(group, data)
        waiting = self.awaiting.pop(group, None)
        store = self.state.group(group)
        if waiting:
            self.metrics.key_group_counts[group] += len(waiting)
            self.ctx.processing_time = time.time()
            self.ctx.in_processing_time = False
            out_v: list = []
            out_t: list = []
            v = k = None
            try:
                for k, v, t, self.ctx.side, self.ctx.watermark in waiting:
                    self._call(group, store, k, v, t, out_v, out_t)
            except Exception as exc:
                raise self._fail(exc, v, k, keyed=True) from exc
            self._count_late()
            self.outputs.emit(out_v, out_t)
        self.on_watermark(self.watermark)  # its timers due by now

    def _count_late(self) -> None:
        if self.ctx.late:
            self.metrics.late_records += self.ctx.late
            self.ctx.late = 0

    # -- timers ----------------------------------------------------------------------------

    def _index(self) -> None:
        """Put the timer tables of groups new here (or back) in the heaps."""
        arrivals = self.state.arrivals
        for g, store in self.state.groups().items():
            tenure = arrivals.get(g)
            if self._indexed.get(g) == tenure:
                continue
            self._indexed[g] = tenure
            table = store.get(TIMERS)
            if table is None:
                continue
            for t in table.event:
                heapq.heappush(self._heaps[0], (t, g))
            for t in table.processing:
                heapq.heappush(self._heaps[1], (t, g))
                self.wakeup = min(self.wakeup, t)
        for g in [g for g in self._indexed if g not in arrivals]:
            del self._indexed[g]

    def keep_all(self) -> None:
        """The groups that were to leave stay: their timers (skipped meanwhile) are put
        back in the heaps."""
        for g in self.leaving:
            self._indexed.pop(g, None)
        super().keep_all()

    def on_watermark(self, watermark: float) -> None:
        """The task's watermark rose to ``watermark``: fire the event-time timers due."""
        self.watermark = max(self.watermark, watermark)
        self._fire(False, self.watermark)

    def on_processing_time(self, now: float) -> None:
        """The wall clock reached ``now``: fire the processing-time timers due."""
        self._fire(True, now)

    def _fire(self, processing: bool, upto: float) -> None:
        self._index()
        heap = self._heaps[processing]
        groups = self.state.groups()
        ctx, on_timer = self.ctx, self.fn.on_timer
        ctx.watermark = self.watermark
        ctx.in_processing_time = processing
        out_v: list = []
        out_t: list = []
        k = None
        try:
            while heap and heap[0][0] <= upto:
                t, g = heapq.heappop(heap)
                if g in self.leaving:  # fires where it goes (KeyedProcessor.give_away)
                    continue
                store = groups.get(g)
                table = None if store is None else store.get(TIMERS)
                times = None if table is None else (table.processing if processing else table.event)
                keys = None if times is None else times.pop(t, None)
                if not keys:
                    continue
                if not table:
                    del store[TIMERS]
                self._changed(g, TIMERS)
                ctx._store = self._store = store
                ctx.timestamp = t
                ctx.processing_time = time.time()
                ctx.group = self._group = g
                for k in keys:
                    ctx._key = k
                    self._changed(g, k)
                    r = on_timer(k, t, ctx)
                    if r:
                        for o in r:
                            out_v.append(o)
                            out_t.append(t)
        except Exception as exc:
            raise self._fail(exc, f"<timer at {upto}>", k, keyed=True) from exc
        finally:
            if processing:
                self.wakeup = heap[0][0] if heap else math.inf
        self.outputs.emit(out_v, out_t)

    def close(self) -> None:
        """Every input has ended: nothing more can come, so every timer left fires (event
        time as at the final watermark, then processing time)."""
        self.watermark = math.inf
        self._fire(False, math.inf)
        self._fire(True, math.inf)
