"""The processors of map, flat_map, filter, keyed (without timers) and sink tasks: their hot
loops.

A :class:`Processor` is built once per task from its :class:`~runtime.dataflow.OperatorSpec`
and called by the task loop with each input batch; it routes its outputs into the task's
:class:`~runtime.partitioning.Outputs` (no I/O; the task loop flushes). A UDF that raises
becomes a :class:`UserCodeError` naming the task, the operator's logic, the record and,
for keyed operators, the key.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from ..aggregate import SplitPart
from ..dataflow import OperatorSpec, logic_ref
from ..errors import StreamRuntimeError
from ..keygroups import key_group_fn
from ..metrics import TaskMetrics
from ..partitioning import Outputs
from ..state import KeyedState, KeyGroupNotOwnedError, ValueState

if TYPE_CHECKING:
    from ..checkpoints.taking import GroupChains

__all__ = [
    "FilterProcessor",
    "FlatMapProcessor",
    "KeyedProcessor",
    "MapProcessor",
    "Processor",
    "SinkProcessor",
    "UserCodeError",
]

logger = logging.getLogger(__name__)

COMMIT_SETTLE_TIMEOUT_S = 60.0  # a sink's commit off the loop ends within this before it closes


class UserCodeError(StreamRuntimeError, RuntimeError):
    """A UDF raised; the message names task, logic, record (and key) and the original error."""


def _short(obj: Any, limit: int = 200) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[:limit] + "..."


class Processor:
    """Processes input batches of one task; subclasses hold the hot loop of one kind."""

    def __init__(
        self, task_id: str, op: OperatorSpec, outputs: Outputs, metrics: TaskMetrics
    ) -> None:
        self.task_id = task_id
        self.op = op
        self.fn = op.logic
        self.outputs = outputs
        self.metrics = metrics

    def _fail(
        self, exc: BaseException, record: Any, key: Any = None, keyed: bool = False
    ) -> UserCodeError:
        where = f"task {self.task_id!r}: {logic_ref(self.fn)} raised {type(exc).__name__}: {exc}"
        what = f" on record {_short(record)}" + (f" (key {_short(key)})" if keyed else "")
        return UserCodeError(where + what)

    def process(self, key_fn: Any, values: Sequence, stamps: Sequence[float]) -> None:
        raise NotImplementedError

    wakeup = math.inf  # when (wall clock) on_processing_time is due; inf: never

    def on_watermark(self, watermark: float) -> None:
        """The task's event-time watermark rose to ``watermark`` (see :mod:`runtime.eventtime`)."""

    def on_processing_time(self, now: float) -> None:
        """The wall clock passed :attr:`wakeup`."""

    def close(self) -> None:
        """End of all inputs (called once, before end of stream goes downstream)."""


class MapProcessor(Processor):
    def process(self, key_fn: Any, values: Sequence, stamps: Sequence[float]) -> None:
        fn = self.fn
        try:
            out = [fn(v) for v in values]
        except Exception as exc:
            for v in values:  # find the culprit: map logic is stateless
                try:
                    fn(v)
                except Exception as inner:
                    raise self._fail(inner, v) from inner
            raise self._fail(exc, "?") from exc
        self.outputs.emit(out, stamps)


class FlatMapProcessor(Processor):
    def process(self, key_fn: Any, values: Sequence, stamps: Sequence[float]) -> None:
        fn = self.fn
        out_v: list = []
        out_t: list = []
        ext_v, ext_t = out_v.extend, out_t.extend
        v = None
        try:
            for v, t in zip(values, stamps, strict=True):
                r = fn(v)
                if type(r) is not list and type(r) is not tuple:
                    r = list(r)
                ext_v(r)
                ext_t([t] * len(r))
        except Exception as exc:
            raise self._fail(exc, v) from exc
        self.outputs.emit(out_v, out_t)


class FilterProcessor(Processor):
    def process(self, key_fn: Any, values: Sequence, stamps: Sequence[float]) -> None:
        fn = self.fn
        v = None
        try:
            keep = [i for i, v in enumerate(values) if fn(v)]
        except Exception as exc:
            for v in values:
                try:
                    fn(v)
                except Exception as inner:
                    raise self._fail(inner, v) from inner
            raise self._fail(exc, v) from exc
        if len(keep) == len(values):
            self.outputs.emit(values, stamps)
        else:
            self.outputs.emit([values[i] for i in keep], [stamps[i] for i in keep])


class KeyedProcessor(Processor):
    """Calls ``fn(key, record, state)`` with ``state`` bound to the record's key.

    In fluid mode a task can own key groups whose state is still on its way
    (:meth:`await_groups`): their records wait in :attr:`awaiting`, in arrival order, and
    are processed when the state comes (:meth:`arrive`); other groups go on meanwhile.

    A key group copied ahead to its next owner (:mod:`runtime.precopy`) is *tracked*
    (:meth:`track`): the keys its records touch from then on are noted, since their
    values may have changed (a UDF may change a value in place without ``set``).

    A task of a checkpointed job notes the keys its records touch in every group
    (:meth:`note_changes`), for its next incremental checkpoint (:meth:`take_changes`).

    :attr:`splits` (key -> key groups, from the layout) lists the split keys of a
    combinable operator (:mod:`runtime.aggregate`); the processors that run one
    (:class:`~runtime.operators.aggregate.AggregateProcessor`, and
    :class:`~runtime.operators.timed.TimedKeyedProcessor` for a windowed one) keep a
    split key's records in the part this task holds (:meth:`split_part`).
    """

    splits: Mapping[Any, tuple[int, ...]] = {}

    def __init__(
        self,
        task_id: str,
        op: OperatorSpec,
        outputs: Outputs,
        metrics: TaskMetrics,
        state: KeyedState,
    ) -> None:
        super().__init__(task_id, op, outputs, metrics)
        self.state = state
        self.key_group = key_group_fn(op.max_parallelism)
        self._value_state = ValueState()
        self.awaiting: dict[int, list[tuple[Any, Any, float]]] = {}
        self.leaving: set[int] = set()  # groups given away while it runs (:meth:`give_away`)
        self.touched: dict[int, set] = {}  # tracked key group -> keys touched since
        # Key group -> keys touched since the last checkpoint capture (None: not noted),
        # and the chains of its checkpoint parts (runtime.checkpoints.taking).
        self.changed: defaultdict[int, set] | None = None
        self.chains: GroupChains | None = None

    def split_part(self, key: Any, home: int, parts: tuple[int, ...]) -> tuple[int, Any]:
        """The key group and state key of the part of split ``key`` (home group ``home``,
        its parts' groups ``parts``) that this task holds: the first of ``parts`` it owns
        or awaits (in fluid mode), under ``key`` in ``home`` and under
        :class:`~runtime.aggregate.SplitPart` ``(key)`` in another group. When it holds
        none, the first of all: the caller reports that group not owned."""
        groups = self.state.groups()
        for g in parts:
            if g in groups or g in self.awaiting:
                return g, key if g == home else SplitPart(key)
        return parts[0], key if parts[0] == home else SplitPart(key)

    def note_changes(self) -> None:
        """Note from now on the keys that records touch, in every group."""
        if self.changed is None:
            self.changed = defaultdict(set)

    def take_changes(self) -> dict[int, set]:
        """The keys touched since the last call (or :meth:`note_changes`), per group;
        noting starts afresh."""
        changed = self.changed
        if changed is None:
            return {}
        self.changed = defaultdict(set)
        return changed

    def track(self, group: int) -> None:
        """Note from now on the keys of ``group`` that records touch."""
        self.touched[group] = set()

    def untrack(self, group: int) -> set | None:
        """Stop tracking ``group``; the keys touched since :meth:`track` (None if it was
        not tracked)."""
        return self.touched.pop(group, None)

    def await_groups(self, groups: Iterable[int]) -> None:
        """Take records of ``groups`` before their state arrives: they wait for it."""
        for g in groups:
            if not self.state.owns(g):
                self.awaiting.setdefault(g, [])

    def give_away(self, groups: Iterable[int]) -> None:
        """From this task's barrier on, records of ``groups`` go to their new owners while
        it runs (fluid) and still holds their state until it is shipped: nothing of them
        may be decided here any more (their timers fire where the state goes, with the
        records that went there). Shipping a group ends its entry (:meth:`shipped`)."""
        self.leaving.update(groups)

    def shipped(self, group: int) -> None:
        self.leaving.discard(group)

    def keep_all(self) -> None:
        """The change that would have taken :attr:`leaving` away was aborted: they stay."""
        self.leaving.clear()

    def cancel_awaiting(self) -> int:
        """Stop waiting for any key group (an aborted reconfiguration); returns how many
        records were waiting (none can be: no record of such a group is routed here
        before the update)."""
        waiting = sum(len(b) for b in self.awaiting.values())
        self.awaiting.clear()
        return waiting

    def arrive(self, group: int, data: Any) -> None:
        """The state of an awaited ``group`` arrived (exported bytes, or the key -> value
        dict from a task of the same worker): own it, then process its waiting records."""
        self.state.take_in(group, data)
        waiting = self.awaiting.pop(group, None)
        if not waiting:
            return
        fn = self.fn
        store = self.state.group(group)
        self.metrics.key_group_counts[group] += len(waiting)
        touched = self.touched.get(group)
        if touched is not None:
            touched.update(k for k, _v, _t in waiting)
        if self.changed is not None:
            self.changed[group].update(k for k, _v, _t in waiting)
        st = self._value_state
        st._store = store
        out_v: list = []
        out_t: list = []
        v = k = None
        try:
            for k, v, t in waiting:
                st._key = k
                r = fn(k, v, st)
                if r:
                    for o in r:
                        out_v.append(o)
                        out_t.append(t)
        except Exception as exc:
            raise self._fail(exc, v, k, keyed=True) from exc
        self.outputs.emit(out_v, out_t)

    def process(self, key_fn: Any, values: Sequence, stamps: Sequence[float]) -> None:
        fn = self.fn
        kg_of = self.key_group
        cached = kg_of.cache.get
        groups = self.state.groups()
        awaiting = self.awaiting
        counts = self.metrics.key_group_counts
        touched = self.touched or None  # one test per record while nothing is tracked
        changed = self.changed
        st = self._value_state
        out_v: list = []
        out_t: list = []
        add_v, add_t = out_v.append, out_t.append
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
                store = groups.get(g)
                if store is None:
                    waiting = awaiting.get(g)
                    if waiting is None:
                        raise KeyGroupNotOwnedError(self.task_id, g)
                    waiting.append((k, v, t))  # its state is on its way
                    continue
                counts[g] += 1
                if touched is not None and g in touched:
                    touched[g].add(k)
                if changed is not None:
                    changed[g].add(k)
                st._store = store
                st._key = k
                r = fn(k, v, st)
                if r:
                    for o in r:
                        add_v(o)
                        add_t(t)
        except KeyGroupNotOwnedError as exc:
            raise UserCodeError(f"{exc.args[0]} (record {_short(v)}, key {_short(k)})") from exc
        except Exception as exc:
            raise self._fail(exc, v, k, keyed=True) from exc
        self.outputs.emit(out_v, out_t)


class SinkProcessor(Processor):
    """Writes a sink task's batches; commits its writer's prepared transactions when a
    checkpoint completes: on the task's loop, or, for a writer whose
    :attr:`~runtime.io.SinkWriter.commits_off_loop` is set, on a thread of its own (one
    commit at a time, in checkpoint order) while the task goes on writing. Before the
    writer closes, aborts or hands over, a commit under way ends (:meth:`settle`)."""

    def __init__(
        self, task_id: str, op: OperatorSpec, outputs: Outputs, metrics: TaskMetrics, index: int
    ) -> None:
        super().__init__(task_id, op, outputs, metrics)
        self.writer = op.logic.open(index, op.parallelism)
        self._committer: ThreadPoolExecutor | None = None
        self._committing: Future | None = None

    def process(self, key_fn: Any, values: Sequence, stamps: Sequence[float]) -> None:
        try:
            self.writer.write(values)
        except Exception as exc:
            raise UserCodeError(
                f"task {self.task_id!r}: sink {logic_ref(self.op.logic)} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def commit(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: commit what the writer prepared up to
        it. On the loop, a failure raises (the caller logs it; the next commit or a
        recovery's restore commits again); off it, a failure is logged."""
        if not self.writer.commits_off_loop:
            self.writer.commit(checkpoint_id)
            return
        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix=f"commit-{self.task_id}")
        done = self._committer.submit(self.writer.commit, checkpoint_id)
        done.add_done_callback(lambda f: _commit_ended(self.task_id, checkpoint_id, f))
        self._committing = done

    def settle(self) -> None:
        """Wait (on the loop, at most ``COMMIT_SETTLE_TIMEOUT_S``) for a commit under way."""
        committing, self._committing = self._committing, None
        if committing is None:
            return
        try:
            committing.result(COMMIT_SETTLE_TIMEOUT_S)
        except FutureTimeout:
            logger.warning(
                "task %s: a commit still runs after %.0fs; the writer closes anyway",
                self.task_id,
                COMMIT_SETTLE_TIMEOUT_S,
            )
        except Exception:  # logged when it ended
            pass

    def _stop_committing(self) -> None:
        self.settle()
        if self._committer is not None:
            self._committer.shutdown(wait=False)
            self._committer = None

    def hand_over(self, barrier_id: int, moving: bool) -> Any:
        """The task leaves at a reconfiguration barrier (see ``SinkWriter.hand_over``)."""
        self._stop_committing()
        return self.writer.hand_over(barrier_id, moving)

    def close(self) -> None:
        self._stop_committing()
        self.writer.close()

    def abort(self) -> None:
        """The task stops before its end: the writer releases its resources now."""
        self._stop_committing()
        self.writer.abort()


def _commit_ended(task_id: str, checkpoint_id: int, done: Future) -> None:
    error = None if done.cancelled() else done.exception()
    if error is not None:
        logger.warning(
            "task %s: checkpoint %s not committed yet: %s", task_id, checkpoint_id, error
        )
