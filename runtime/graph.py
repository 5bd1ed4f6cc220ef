"""Job graphs: operators, their inputs and logic, validated; and references to logic.

A :class:`JobGraph` is what :meth:`runtime.dataflow.Dataflow.compile` (or a job's build
in the control plane's throwaway process, :mod:`runtime.jobbuild`) produces: operators in
topological order, each an :class:`OperatorSpec` whose logic, key selectors and event
time must be importable or picklable. :meth:`JobGraph.of` validates the structure and
raises :class:`DataflowError` naming the operator and what to fix.

The control plane never holds user objects: logic travels as :class:`Pickled` (the
pickle a build made and its ref) or :class:`LogicRef` (a ref resolved where it is
unpickled, :func:`resolve_ref`); both unpickle on a worker as the real object.
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
    "DataflowError",
    "InputSpec",
    "JobGraph",
    "JobRefError",
    "LogicRef",
    "OperatorSpec",
    "Pickled",
    "checked_partitions",
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
    event time (:mod:`runtime.eventtime`; None: ingestion time); ``combinable`` marks the
    partial side of a combinable aggregation (:mod:`runtime.aggregate`, or windowed:
    :mod:`runtime.window_aggregate`), whose hot keys a plan may split over several tasks."""

    name: str
    kind: Kind
    logic: Any
    parallelism: int = 1
    inputs: tuple[InputSpec, ...] = ()
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    partitions: tuple[str, ...] | None = None
    event_time: EventTime | None = None
    combinable: bool = False

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
        if op.kind not in ("sink",) and not (built or callable(op.logic) or op.combinable):
            raise DataflowError(f"{where}: logic {op.logic!r} is not callable")
    if op.combinable and op.kind != "keyed":
        raise DataflowError(f"{where}: only a keyed operator aggregates combinably")
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
