"""The dataflow API: a frozen graph of operators, built in Python, validated before it runs.

Build a job with :class:`Dataflow`, chaining transformations on streams::

    flow = Dataflow("wordcount")
    lines = flow.source("lines", Generator(...), parallelism=2)
    words = lines.flat_map("split", split_words)
    counts = words.key_by(identity).process("count", count_word)
    counts.sink("out", Collect("out/"))
    graph = flow.compile()          # -> JobGraph, or DataflowError naming the operator

Logic (UDFs, key selectors, sources, sinks) must be importable or picklable with the
standard :mod:`pickle`: module-level functions and instances of module-level classes are;
lambdas and closures are not. Workers receive the graph pickled, so the same rule also
makes a logic reference stable for ``assignLogic``.

The graph's types, its validation and references to logic are in :mod:`runtime.graph`
(re-exported here).

Keyed operators own ``max_parallelism`` key groups (fixed for the job's life, default
128), every input of a keyed operator is partitioned by key group, and a keyed UDF is
called as ``fn(key, value, state)`` with ``state`` bound to ``key`` (see
:class:`runtime.state.ValueState`); it returns an iterable of output records or ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .eventtime import EventTime
from .graph import (
    DataflowError,
    InputSpec,
    JobGraph,
    JobRefError,
    Kind,
    LogicRef,
    OperatorSpec,
    Partitioning,
    Pickled,
    checked_partitions,
    logic_ref,
    resolve_ref,
)
from .io import Sink, Source
from .keygroups import DEFAULT_MAX_PARALLELISM

__all__ = [
    "ConnectedStreams",
    "Dataflow",
    "DataflowError",
    "InputSpec",
    "JobGraph",
    "JobRefError",
    "KeyedStream",
    "LogicRef",
    "OperatorSpec",
    "Pickled",
    "Stream",
    "checked_partitions",
    "load_job",
    "logic_ref",
    "resolve_ref",
]


class Dataflow:
    """A builder of job graphs; :meth:`compile` validates and freezes it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._ops: list[OperatorSpec] = []

    def source(
        self,
        name: str,
        source: Source,
        *,
        parallelism: int = 1,
        event_time: EventTime | None = None,
    ) -> Stream:
        """Add a source operator; returns its output stream. With ``event_time`` its
        records are stamped with their event time and its tasks send watermarks (see
        :mod:`runtime.eventtime`): what windows and event-time timers run on."""
        return self._add(OperatorSpec(name, "source", source, parallelism, event_time=event_time))

    def union(self, *streams: Stream) -> Stream:
        """One stream reading from all of ``streams`` (the next operator gets several inputs)."""
        return Stream(self, tuple(i for s in streams for i in s._inputs))

    def compile(self) -> JobGraph:
        return JobGraph.of(self.name, self._ops)

    def _add(self, spec: OperatorSpec) -> Stream:
        self._ops.append(spec)
        return Stream(self, (_Pending(spec.name, None, None),))


@dataclass(frozen=True, slots=True)
class _Pending:
    upstream: str
    partitioning: Partitioning | None
    key: Callable | None


class Stream:
    """The output of one or more operators; each method adds an operator reading it."""

    def __init__(self, flow: Dataflow, inputs: tuple[_Pending, ...]) -> None:
        self._flow = flow
        self._inputs = inputs

    def _resolve(self, parallelism: int | None) -> tuple[int, tuple[InputSpec, ...]]:
        ops = {op.name: op for op in self._flow._ops}
        ups = [ops[p.upstream] for p in self._inputs]
        if parallelism is None:
            parallelism = max(u.parallelism for u in ups)
        specs = []
        for p, up in zip(self._inputs, ups, strict=True):
            part = p.partitioning or ("forward" if up.parallelism == parallelism else "rebalance")
            specs.append(InputSpec(p.upstream, part, p.key))
        return parallelism, tuple(specs)

    def _then(
        self, name: str, kind: Kind, logic: Any, parallelism: int | None, **kw: Any
    ) -> Stream:
        parallelism, inputs = self._resolve(parallelism)
        return self._flow._add(OperatorSpec(name, kind, logic, parallelism, inputs, **kw))

    def map(self, name: str, fn: Callable[[Any], Any], *, parallelism: int | None = None) -> Stream:
        """Each record ``r`` becomes ``fn(r)``."""
        return self._then(name, "map", fn, parallelism)

    def flat_map(
        self, name: str, fn: Callable[[Any], Any], *, parallelism: int | None = None
    ) -> Stream:
        """Each record ``r`` becomes the records of the iterable ``fn(r)``."""
        return self._then(name, "flat_map", fn, parallelism)

    def filter(
        self, name: str, fn: Callable[[Any], bool], *, parallelism: int | None = None
    ) -> Stream:
        """Keep the records for which ``fn(r)`` is true."""
        return self._then(name, "filter", fn, parallelism)

    def rebalance(self) -> Stream:
        """Spread records over the next operator's tasks (by weight), whatever the parallelism."""
        return Stream(
            self._flow, tuple(_Pending(p.upstream, "rebalance", None) for p in self._inputs)
        )

    def broadcast(self) -> Stream:
        """Send every record to every task of the next operator."""
        return Stream(
            self._flow, tuple(_Pending(p.upstream, "broadcast", None) for p in self._inputs)
        )

    def key_by(self, key: Callable[[Any], Any]) -> KeyedStream:
        """Partition by ``key(record)``: each key goes to the task owning its key group."""
        return KeyedStream(
            self._flow, tuple(_Pending(p.upstream, "key_groups", key) for p in self._inputs)
        )

    def sink(self, name: str, sink: Sink, *, parallelism: int | None = None) -> None:
        """Write the stream to ``sink``."""
        self._then(name, "sink", sink, parallelism)


class KeyedStream(Stream):
    """A stream partitioned by key; :meth:`process` adds a keyed, stateful operator."""

    def process(
        self,
        name: str,
        fn: Callable[[Any, Any, Any], Any],
        *,
        parallelism: int | None = None,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    ) -> Stream:
        """``fn(key, record, state)`` per record; returns an iterable of outputs or None.
        A ``fn`` with an ``on_timer`` method (a :class:`runtime.timers.KeyedProcessFunction`)
        gets a :class:`runtime.timers.KeyContext` as ``state``: timers, the record's
        timestamp and the watermark."""
        return self._then(name, "keyed", fn, parallelism, max_parallelism=max_parallelism)

    def window(
        self,
        name: str,
        assigner: Any,
        *,
        aggregate: Any = None,
        apply: Callable[[Any, float, float, list], Any] | None = None,
        allowed_lateness_s: float = 0.0,
        late: Literal["drop", "emit"] = "drop",
        emit: Literal["close", "update"] = "close",
        time: Literal["event", "processing"] = "event",
        parallelism: int | None = None,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    ) -> Stream:
        """Windows per key (:mod:`runtime.windows`): ``assigner`` is a ``Tumbling``,
        ``Sliding``, ``Session`` or ``CountWindow``; give ``aggregate`` (an incremental
        ``Aggregate``: ``Count()``, ``Sum(of)``, ``Mean(of)``, ``Reduce(fn)``...) or
        ``apply(key, start, end, records)``. Emits a ``WindowResult(key, start, end,
        value)`` per window (or what ``apply`` returns). Bad options raise
        :class:`DataflowError` naming the operator. To split hot keys of an aggregate
        over tumbling or sliding windows, see :meth:`window_aggregate`."""
        from .windows import WindowLogic

        try:
            logic = WindowLogic(assigner, aggregate, apply, allowed_lateness_s, late, emit, time)
        except ValueError as exc:
            raise DataflowError(f"operator {name!r}: {exc}") from None
        return self._then(name, "keyed", logic, parallelism, max_parallelism=max_parallelism)

    def aggregate(
        self,
        name: str,
        aggregate: Any,
        *,
        parallelism: int | None = None,
        merge_parallelism: int | None = None,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    ) -> Stream:
        """A running aggregation per key (:mod:`runtime.aggregate`): ``aggregate`` is an
        ``Aggregate`` whose accumulators merge (``Count()``, ``Sum(of)``, ``Mean(of)``,
        ``Min``, ``Max``, ``Reduce(fn)``, or one's own); emits ``(key, result)`` as a key's
        value changes, at most once per key and batch. Two operators: ``name`` folds the
        records (a plan may split its hot keys over several of its tasks) and
        ``name.merge`` combines the parts. :class:`DataflowError` names a bad aggregate."""
        from .aggregate import MergeAggregate, PartialAggregate, check_combinable

        try:
            check_combinable(aggregate)
        except ValueError as exc:
            raise DataflowError(f"operator {name!r}: {exc}") from None
        return self._two_phase(
            name,
            PartialAggregate(aggregate),
            MergeAggregate(aggregate),
            parallelism,
            merge_parallelism,
            max_parallelism,
        )

    def window_aggregate(
        self,
        name: str,
        assigner: Any,
        aggregate: Any,
        *,
        allowed_lateness_s: float = 0.0,
        late: Literal["drop", "emit"] = "drop",
        time: Literal["event"] = "event",
        parallelism: int | None = None,
        merge_parallelism: int | None = None,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    ) -> Stream:
        """:meth:`window` with ``aggregate=``, whose hot keys a plan may split over
        several tasks (:mod:`runtime.window_aggregate`): the same ``WindowResult(key,
        start, end, value)`` per window, from two operators: ``name`` aggregates each
        key's part of a window and ``name.merge`` merges the parts once the watermark
        passes the window's end. ``assigner`` is a ``Tumbling`` or ``Sliding``, ``time``
        event time, ``aggregate`` an ``Aggregate`` whose accumulators merge; anything else
        (sessions, count windows, ``apply`` functions, processing time) raises
        :class:`DataflowError` saying to use :meth:`window`."""
        from .window_aggregate import PartialWindow, WindowMerge, check_splittable

        try:
            check_splittable(assigner, aggregate, allowed_lateness_s, time)
            partial = PartialWindow(assigner, aggregate, None, allowed_lateness_s, late)
        except ValueError as exc:
            raise DataflowError(f"operator {name!r}: {exc}") from None
        return self._two_phase(
            name,
            partial,
            WindowMerge(aggregate, allowed_lateness_s, late),
            parallelism,
            merge_parallelism,
            max_parallelism,
        )

    def _two_phase(
        self,
        name: str,
        partial: Any,
        merge: Any,
        parallelism: int | None,
        merge_parallelism: int | None,
        max_parallelism: int,
    ) -> Stream:
        """``name`` (combinable: a plan may split its keys) running ``partial``, then
        ``name.merge`` running ``merge`` keyed by the key of what ``partial`` emits."""
        from .aggregate import part_key

        parts = self._then(
            name, "keyed", partial, parallelism, max_parallelism=max_parallelism, combinable=True
        )
        return parts.key_by(part_key).process(
            f"{name}.merge",
            merge,
            parallelism=merge_parallelism or parallelism,
            max_parallelism=max_parallelism,
        )

    def connect(self, other: KeyedStream) -> ConnectedStreams:
        """This stream (the left side) and ``other`` (the right), into one keyed operator:
        records of the same key meet in the same task and state (:mod:`runtime.joins`)."""
        if not isinstance(other, KeyedStream):
            raise DataflowError("connect(...) takes a keyed stream: call key_by(...) on it first")
        mine = {p.upstream for p in self._inputs}
        shared = sorted(mine & {p.upstream for p in other._inputs})
        if shared:
            raise DataflowError(
                f"connect: operator(s) {', '.join(map(repr, shared))} feed both sides; "
                "split the stream with a map per side first"
            )
        from .joins import LEFT, RIGHT, Sided

        def sided(stream: KeyedStream, side: int) -> tuple[_Pending, ...]:
            return tuple(
                _Pending(p.upstream, p.partitioning, Sided(p.key, side)) for p in stream._inputs
            )

        return ConnectedStreams(self._flow, sided(self, LEFT) + sided(other, RIGHT))


class ConnectedStreams(KeyedStream):
    """Two keyed streams into one keyed operator (see :meth:`KeyedStream.connect`):
    :meth:`process` with a :class:`runtime.joins.CoProcessFunction`, or a join."""

    def interval_join(
        self,
        name: str,
        lower_s: float,
        upper_s: float,
        join: Callable[[Any, Any], Any],
        *,
        parallelism: int | None = None,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    ) -> Stream:
        """``join(l, r)`` for each left ``l`` and right ``r`` of a key with ``l.t +
        lower_s <= r.t <= l.t + upper_s`` (event time; :class:`runtime.joins.IntervalJoin`)."""
        from .joins import IntervalJoin

        try:
            logic = IntervalJoin(lower_s, upper_s, join)
        except ValueError as exc:
            raise DataflowError(f"operator {name!r}: {exc}") from None
        return self.process(name, logic, parallelism=parallelism, max_parallelism=max_parallelism)

    def window_join(
        self,
        name: str,
        assigner: Any,
        join: Callable[[Any, Any], Any],
        *,
        parallelism: int | None = None,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    ) -> Stream:
        """``join(l, r)`` for each left ``l`` and right ``r`` of a key in the same window
        (a ``Tumbling`` or ``Sliding`` one, event time), when it closes
        (:class:`runtime.joins.WindowJoin`)."""
        from .joins import WindowJoin

        try:
            logic = WindowJoin(assigner, join)
        except ValueError as exc:
            raise DataflowError(f"operator {name!r}: {exc}") from None
        return self.process(name, logic, parallelism=parallelism, max_parallelism=max_parallelism)


def load_job(ref: str, params: Mapping[str, Any] | None = None) -> JobGraph:
    """Resolve ``package.module:callable``, call it with ``params`` and compile the result.

    Raises :class:`JobRefError` for a malformed or unresolvable reference or a callable
    that returns something else than a Dataflow/JobGraph; :class:`DataflowError` and
    :class:`runtime.params.ParamError` pass through with their own messages.
    """
    fn = resolve_ref(ref)
    result = fn(dict(params or {}))
    if isinstance(result, Dataflow):
        return result.compile()
    if isinstance(result, JobGraph):
        return result
    raise JobRefError(f"job {ref!r} returned {type(result).__name__}, expected a Dataflow")
