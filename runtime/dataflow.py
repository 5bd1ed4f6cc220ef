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

The control plane never holds user objects: it builds graphs in a throwaway process
(:mod:`runtime.jobbuild`), which hands each piece of logic over as :class:`Pickled` (the
pickle and its ref), and it names swapped logic by :class:`LogicRef`. Both pickle into
what a worker unpickles as the real object, so the coordinator ships such a graph as it is.

Keyed operators own ``max_parallelism`` key groups (fixed for the job's life, default
128), every input of a keyed operator is partitioned by key group, and a keyed UDF is
called as ``fn(key, value, state)`` with ``state`` bound to ``key`` (see
:class:`runtime.state.ValueState`); it returns an iterable of output records or ``None``.
"""

from __future__ import annotations

import importlib
import pickle
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from . import codeload
from .errors import StreamRuntimeError
from .eventtime import EventTime
from .io import PartitionedSource, Sink, Source
from .keygroups import DEFAULT_MAX_PARALLELISM

__all__ = [
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
    "load_job",
    "logic_ref",
    "resolve_ref",
]

Kind = Literal["source", "map", "flat_map", "filter", "keyed", "sink"]
Partitioning = Literal["forward", "rebalance", "key_groups", "broadcast"]
KINDS: tuple[str, ...] = ("source", "map", "flat_map", "filter", "keyed", "sink")
PARTITIONINGS: tuple[str, ...] = ("forward", "rebalance", "key_groups", "broadcast")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.]*$")


class DataflowError(StreamRuntimeError, ValueError):
    """A job graph that cannot run; the message names the operator and what to fix."""


class JobRefError(StreamRuntimeError, ValueError):
    """A ``package.module:callable`` job reference that does not resolve to a job."""


@dataclass(frozen=True, slots=True)
class Pickled:
    """A piece of logic as the pickle a job's build made of it, with its :func:`logic_ref`.

    The control plane's graphs hold logic in this form (:mod:`runtime.jobbuild`): their
    structure can be read and shipped without importing user code. Pickling it gives
    ``pickle.loads(data)``, so whoever unpickles a graph holding it (a worker) gets the
    original object. Nothing here ever unpickles ``data``.
    """

    ref: str
    data: bytes = field(repr=False)

    def __reduce__(self) -> tuple[Any, ...]:
        return (pickle.loads, (self.data,))


@dataclass(frozen=True, slots=True)
class LogicRef:
    """Logic named by its ref and resolved where it is unpickled: pickling it gives
    ``resolve_ref(ref)``, so a worker imports the callable (or takes it from an upload
    installed there) while the control plane that shipped it imported nothing."""

    ref: str

    def __reduce__(self) -> tuple[Any, ...]:
        return (resolve_ref, (self.ref,))


def logic_ref(obj: object) -> str:
    """A readable reference to a piece of logic: ``module:qualname`` or ``module:Class(...)``
    (a :class:`Pickled` or :class:`LogicRef` gives the ref it carries)."""
    if isinstance(obj, Pickled | LogicRef):
        return obj.ref
    if callable(obj) and hasattr(obj, "__qualname__") and hasattr(obj, "__module__"):
        return f"{_module_ref(obj.__module__)}:{obj.__qualname__}"
    cls = type(obj)
    return f"{_module_ref(cls.__module__)}:{cls.__qualname__}(...)"


def _module_ref(module: str) -> str:
    """``streampilot_code.c7`` reads ``code:7`` (the form users give); others unchanged."""
    prefix = codeload.PACKAGE + ".c"
    return f"code:{module[len(prefix) :]}" if module.startswith(prefix) else module


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One input of an operator: its upstream operator and how records are partitioned."""

    upstream: str
    partitioning: Partitioning = "forward"
    key: Callable[[Any], Any] | None = None


@dataclass(frozen=True, slots=True)
class OperatorSpec:
    """One operator: its kind, logic, parallelism and inputs; ``partitions`` the names a
    partitioned source listed when the job was submitted (``()`` until then: a worker
    lists them; None for any other operator); ``event_time`` how a source's records carry
    event time (:mod:`runtime.eventtime`; None: ingestion time)."""

    name: str
    kind: Kind
    logic: Any
    parallelism: int = 1
    inputs: tuple[InputSpec, ...] = ()
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    partitions: tuple[str, ...] | None = None
    event_time: EventTime | None = None

    @property
    def keyed(self) -> bool:
        return self.kind == "keyed"

    def task_ids(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.parallelism)]


def _check_picklable(op: str, what: str, obj: object) -> None:
    if isinstance(obj, Pickled):  # checked where it was built; never unpickled here
        return
    try:
        pickle.loads(pickle.dumps(obj))
    except Exception as exc:
        hint = (
            "define it at module level (lambdas and nested functions cannot be shipped)"
            if "<lambda>" in repr(obj) or "<locals>" in getattr(obj, "__qualname__", "")
            else "make it importable or picklable"
        )
        raise DataflowError(
            f"operator {op!r}: {what} {logic_ref(obj)} cannot be imported or pickled ({exc}); {hint}"
        ) from exc


@dataclass(frozen=True)
class JobGraph:
    """A validated, immutable job: operators in topological order."""

    name: str
    operators: tuple[OperatorSpec, ...]
    _by_name: Mapping[str, OperatorSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {op.name: op for op in self.operators})

    @classmethod
    def of(cls, name: str, operators: list[OperatorSpec] | tuple[OperatorSpec, ...]) -> JobGraph:
        """Validate ``operators`` and return them as a graph in topological order.

        Raises :class:`DataflowError` for: a bad or duplicate name, an unknown kind or
        partitioning, a non-positive parallelism, an unknown upstream, a cycle, a source
        with inputs or an operator without, a keyed operator whose inputs are not
        partitioned by key group (no ``key_by``), key-group partitioning into a non-keyed
        operator, a forward edge between different parallelisms, logic of the wrong type,
        and logic or key selectors that cannot be imported or pickled. Logic held as
        :class:`Pickled` was checked where it was built: only the structure is checked.
        """
        if not name or not isinstance(name, str):
            raise DataflowError("a job needs a non-empty name")
        ops: dict[str, OperatorSpec] = {}
        for op in operators:
            if not isinstance(op.name, str) or not _NAME.fullmatch(op.name):
                raise DataflowError(
                    f"operator name {op.name!r} is invalid: use letters, digits, '_' and '.', "
                    "starting with a letter"
                )
            if op.name in ops:
                raise DataflowError(f"operator {op.name!r} is defined twice")
            ops[op.name] = op
        if not ops:
            raise DataflowError(f"job {name!r} has no operators")
        for op in ops.values():
            _validate_operator(op, ops)
        for op_name, op in list(ops.items()):
            if op.partitions is None and isinstance(op.logic, PartitionedSource):
                ops[op_name] = replace(op, partitions=())  # listed by a worker at submit
        order = _topological_order(ops)
        return cls(name, tuple(ops[n] for n in order))

    def operator(self, name: str) -> OperatorSpec:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"job {self.name!r} has no operator {name!r}") from None

    def downstream(self, name: str) -> list[tuple[OperatorSpec, InputSpec]]:
        """Operators reading from ``name``, with the input spec of that edge."""
        return [(op, inp) for op in self.operators for inp in op.inputs if inp.upstream == name]

    def sources(self) -> list[OperatorSpec]:
        return [op for op in self.operators if op.kind == "source"]

    def task_ids(self) -> list[str]:
        return [t for op in self.operators for t in op.task_ids()]


def checked_partitions(op: OperatorSpec, names: Any) -> tuple[str, ...]:
    """``names``, the partitions source ``op`` listed, as a tuple; :class:`DataflowError`
    if they are not a list of unique non-empty strings (none is fine: its tasks idle, or
    end if it is bounded, until discovery finds some)."""
    where = f"source {op.name!r}"
    if not isinstance(names, list | tuple):
        raise DataflowError(f"{where}: partitions() must return a list of names, got {names!r}")
    if not all(isinstance(p, str) and p for p in names):
        raise DataflowError(f"{where}: partition names must be non-empty strings: {names!r}")
    if len(set(names)) != len(names):
        raise DataflowError(f"{where}: partition names must be unique: {names!r}")
    return tuple(names)


def _validate_operator(op: OperatorSpec, ops: Mapping[str, OperatorSpec]) -> None:
    where = f"operator {op.name!r}"
    if op.kind not in KINDS:
        raise DataflowError(f"{where}: unknown kind {op.kind!r}; one of {', '.join(KINDS)}")
    if (
        not isinstance(op.parallelism, int)
        or isinstance(op.parallelism, bool)
        or op.parallelism < 1
    ):
        raise DataflowError(f"{where}: parallelism must be an int >= 1, got {op.parallelism!r}")
    if op.kind == "keyed":
        if not isinstance(op.max_parallelism, int) or op.max_parallelism < 1:
            raise DataflowError(f"{where}: max_parallelism must be an int >= 1")
        if op.parallelism > op.max_parallelism:
            raise DataflowError(
                f"{where}: parallelism {op.parallelism} exceeds max_parallelism "
                f"{op.max_parallelism} (the number of key groups)"
            )
    built = isinstance(op.logic, Pickled)
    if op.partitions is not None:
        if op.kind != "source":
            raise DataflowError(f"{where}: only a source has partitions")
        if op.partitions:  # () until a worker lists them, when the job is submitted
            checked_partitions(op, op.partitions)
    if op.event_time is not None:
        if op.kind != "source":
            raise DataflowError(f"{where}: only a source assigns event time")
        if not isinstance(op.event_time, EventTime | Pickled):
            raise DataflowError(
                f"{where}: event_time must be a runtime.eventtime.EventTime, got {op.event_time!r}"
            )
        if isinstance(op.event_time, EventTime) and not isinstance(op.event_time.timestamp, str):
            _check_picklable(op.name, "event-time timestamp", op.event_time.timestamp)
    if op.kind == "source":
        if op.inputs:
            raise DataflowError(f"{where}: a source has no inputs")
        if not (built or isinstance(op.logic, Source)):
            raise DataflowError(f"{where}: a source needs a runtime.io.Source, got {op.logic!r}")
    else:
        if not op.inputs:
            raise DataflowError(f"{where}: has no inputs")
        if op.kind == "sink" and not (built or isinstance(op.logic, Sink)):
            raise DataflowError(f"{where}: a sink needs a runtime.io.Sink, got {op.logic!r}")
        if op.kind not in ("sink",) and not (built or callable(op.logic)):
            raise DataflowError(f"{where}: logic {op.logic!r} is not callable")
    for inp in op.inputs:
        if inp.upstream not in ops:
            raise DataflowError(f"{where}: unknown upstream {inp.upstream!r}")
        if inp.partitioning not in PARTITIONINGS:
            raise DataflowError(
                f"{where}: unknown partitioning {inp.partitioning!r} from {inp.upstream!r}; "
                f"one of {', '.join(PARTITIONINGS)}"
            )
        up = ops[inp.upstream]
        if op.kind == "keyed" and inp.partitioning != "key_groups":
            raise DataflowError(
                f"{where}: a keyed operator needs its input {inp.upstream!r} partitioned by key "
                "(call key_by(...) before process(...))"
            )
        if inp.partitioning == "key_groups":
            if op.kind != "keyed":
                raise DataflowError(
                    f"{where}: input from {inp.upstream!r} is partitioned by key but the "
                    "operator is not keyed"
                )
            if inp.key is None or not (isinstance(inp.key, Pickled) or callable(inp.key)):
                raise DataflowError(f"{where}: input from {inp.upstream!r} has no key selector")
            _check_picklable(op.name, "key selector", inp.key)
        if inp.partitioning == "forward" and up.parallelism != op.parallelism:
            raise DataflowError(
                f"{where}: forward input from {inp.upstream!r} needs equal parallelism "
                f"({up.parallelism} vs {op.parallelism}); use rebalance()"
            )
    _check_picklable(op.name, "logic", op.logic)


def _topological_order(ops: Mapping[str, OperatorSpec]) -> list[str]:
    indegree = {n: len(op.inputs) for n, op in ops.items()}
    children: dict[str, list[str]] = {n: [] for n in ops}
    for n, op in ops.items():
        for inp in op.inputs:
            children[inp.upstream].append(n)
    ready = [n for n in ops if indegree[n] == 0]
    order: list[str] = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for c in children[n]:
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    if len(order) != len(ops):
        # Left over: operators on a cycle and those downstream of one; peel the latter off.
        left = {n for n in ops if n not in order}
        changed = True
        while changed:
            changed = False
            for n in list(left):
                if not any(c in left for c in children[n]):
                    left.discard(n)
                    changed = True
        cyclic = sorted(left)
        raise DataflowError(f"operators {', '.join(map(repr, cyclic))} form a cycle")
    return order


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
        :class:`DataflowError` naming the operator."""
        from .windows import WindowLogic

        try:
            logic = WindowLogic(assigner, aggregate, apply, allowed_lateness_s, late, emit, time)
        except ValueError as exc:
            raise DataflowError(f"operator {name!r}: {exc}") from None
        return self._then(name, "keyed", logic, parallelism, max_parallelism=max_parallelism)

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


def resolve_ref(ref: str) -> Callable[..., Any]:
    """Import ``package.module:attr.path`` (or take ``code:<id>:attr.path`` from the
    installed uploads, see :mod:`runtime.codeload`) and return the callable it names."""
    if codeload.is_code_ref(ref):
        try:
            obj = codeload.resolve(ref)
        except codeload.CodeError as exc:
            raise JobRefError(str(exc)) from None
        if not callable(obj):
            raise JobRefError(f"reference {ref!r} is not callable")
        return obj
    if not isinstance(ref, str) or ref.count(":") != 1:
        raise JobRefError(f"reference {ref!r} must look like package.module:callable")
    module_name, attr_path = ref.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except (ImportError, ValueError, TypeError) as exc:
        raise JobRefError(
            f"reference {ref!r}: cannot import module {module_name!r} ({exc})"
        ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise JobRefError(
                f"reference {ref!r}: module {module_name!r} has no {attr_path!r}"
            ) from None
    if not callable(obj):
        raise JobRefError(f"reference {ref!r} is not callable")
    return obj
