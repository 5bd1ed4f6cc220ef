"""A job's recent metrics as a controller reads them (pure).

:class:`MetricsWindow` is the response of ``GET /api/v1/jobs/{id}/metrics``
(``controlplane.metrics.schemas.JobMetricsRead``), read from its JSON form by
:meth:`MetricsWindow.from_dict` and written back by :meth:`MetricsWindow.to_dict`, equal to
the document read (key-group keys are strings in JSON). All rates are per second over the
window; ``busy`` and ``backpressure`` are fractions of the window. Its accessors answer the
questions policies ask::

    m = view.metrics
    m.input_rate("count")            # records/s into the operator
    m.key_group_loads("count")       # {key group: records/s}
    m.state_bytes("count")           # {task: estimated bytes of keyed state}
    m.source_lag("src")              # {partition (or task): records behind the head}
    m.stalled("src")                 # {partition: why it cannot be read now}
    m.key_group_state_bytes("count") # {key group: estimated bytes of its state}
    m.processing_speeds("count")     # {task: records per busy second} (measured tasks only)
    m.hot_keys("count")              # [HotKey(key, group, task, per_s, ...)], heaviest first
    m.traffic_matrix(tasks)          # numpy array of bytes/s from row task to column task
    m.latency.p99_ms                 # end-to-end at the sinks (count == 0: nothing measured)

A task that did not report in the window is absent (:meth:`task` returns None).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

import numpy as np

from . import _json as js
from .errors import ViewError

__all__ = [
    "MIN_BUSY",
    "Channel",
    "HotKey",
    "Latency",
    "MetricsWindow",
    "OperatorSample",
    "TaskSample",
    "WorkerUsage",
]

MIN_BUSY = 0.005  # below this busy fraction a task's speed is noise, not a measurement

_READERS = {
    "float": js.number,
    "int": js.integer,
    "int | None": js.opt_integer,
    "str": js.string,
    "str | None": js.opt_string,
}


class _Record:
    """A frozen dataclass of one JSON object of the metrics response: ``to_dict`` is its
    fields, ``from_dict`` reads each by its annotated scalar type or by ``_special``."""

    _special: ClassVar[Mapping[str, Callable[[Any, str], Any]]] = {}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: Any, path: str) -> Self:
        d = js.obj(data, path)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            reader = cls._special.get(f.name) or _READERS[str(f.type)]
            if f.default is dataclasses.MISSING:  # a field with a default may be absent
                value = js.field(d, f.name, path)
            else:
                value = js.field(d, f.name, path, f.default)
            values[f.name] = reader(value, f"{path}.{f.name}")
        return cls(**values)


@dataclass(frozen=True)
class HotKey:
    """One of a keyed task's heaviest keys over the window. ``key`` is the key as the job
    has it (a JSON array read as a tuple), or when ``key_repr`` its repr (a key JSON cannot
    carry, or a long one). ``per_s - error_per_s`` is a lower bound of its records per
    second; ``per_s`` an upper bound when it was among the task's top keys all the window.
    ``share`` is its fraction of the task's input: a key whose share times the task's
    input rate exceeds what one task can take can only be relieved by splitting it."""

    key: Hashable
    group: int
    task: str
    per_s: float
    error_per_s: float
    share: float
    key_repr: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Its JSON object in a task's ``hot_keys`` (the task is the one it is listed in)."""
        return {
            "key": _json_key(self.key),
            "key_repr": self.key_repr,
            "group": self.group,
            "per_s": self.per_s,
            "error_per_s": self.error_per_s,
            "share": self.share,
        }

    @classmethod
    def from_dict(cls, data: Any, path: str, task: str) -> HotKey:
        d = js.obj(data, path)
        shown = js.field(d, "key_repr", path, False)
        if not isinstance(shown, bool):
            raise ViewError(f"{path}.key_repr: expected a boolean, got {shown!r}")
        key = _read_key(js.field(d, "key", path), f"{path}.key")
        if shown:
            js.string(key, f"{path}.key")
        return cls(
            key=key,
            group=js.integer(js.field(d, "group", path), f"{path}.group"),
            task=task,
            per_s=js.number(js.field(d, "per_s", path), f"{path}.per_s"),
            error_per_s=js.number(js.field(d, "error_per_s", path), f"{path}.error_per_s"),
            share=js.number(js.field(d, "share", path), f"{path}.share"),
            key_repr=shown,
        )


def _read_key(value: Any, path: str) -> Hashable:
    """A key from JSON: a scalar, or an array of keys (as a tuple)."""
    if isinstance(value, list | tuple):
        return tuple(_read_key(v, f"{path}[{i}]") for i, v in enumerate(value))
    if value is None or isinstance(value, str | bool | int | float):
        return value
    raise ViewError(f"{path}: expected a key (a string, number, boolean, null or array)")


def _json_key(key: Hashable) -> Any:
    return [_json_key(k) for k in key] if isinstance(key, tuple) else key


@dataclass(frozen=True)
class TaskSample(_Record):
    """One task over the window (``worker`` is None once the task was removed)."""

    task: str
    operator: str
    worker: str | None
    in_per_s: float
    out_per_s: float
    busy: float
    backpressure: float
    queued: Mapping[str, int]  # records waiting, per upstream task (latest level)
    key_groups: Mapping[int, int]  # records per key group summed over the window
    state_keys: int | None = None  # keys in its state (keyed tasks; latest level)
    state_bytes: int | None = None  # its state's estimated pickled size: what a move ships
    state_key_groups: Mapping[int, int] | None = None  # of that, each key group it owns
    # a partitioned source's task: partition -> {"lag": records behind or None, "stalled"}
    partitions: Mapping[str, Mapping[str, Any]] | None = None
    hot_keys: tuple[HotKey, ...] = ()  # its heaviest keys, heaviest first (keyed tasks)
    lag: int | None = None  # records behind (a source task that is not partitioned; latest)

    _special: ClassVar[Mapping[str, Callable[[Any, str], Any]]] = {
        "queued": js.str_keys,
        "key_groups": js.int_keys,
        "state_key_groups": js.opt_int_keys,
        "partitions": js.opt_partitions,
        "hot_keys": js.array,  # each read by from_dict, which knows the task
    }

    @classmethod
    def from_dict(cls, data: Any, path: str) -> Self:
        sample = super().from_dict(data, path)
        hot = tuple(
            HotKey.from_dict(h, f"{path}.hot_keys[{i}]", sample.task)
            for i, h in enumerate(sample.hot_keys)
        )
        return dataclasses.replace(sample, hot_keys=hot)

    @property
    def queue_length(self) -> int:
        return sum(self.queued.values())

    @property
    def speed(self) -> float | None:
        """Records processed per busy second (the task's service rate), or None when the task
        was too idle to measure it (busy below :data:`MIN_BUSY` or no input)."""
        if self.busy < MIN_BUSY or self.in_per_s <= 0:
            return None
        return self.in_per_s / self.busy

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["queued"] = dict(self.queued)
        d["key_groups"] = {str(g): n for g, n in self.key_groups.items()}
        if self.state_key_groups is not None:
            d["state_key_groups"] = {str(g): n for g, n in self.state_key_groups.items()}
        d["hot_keys"] = [h.to_dict() for h in self.hot_keys]
        return d


@dataclass(frozen=True)
class OperatorSample(_Record):
    """One operator over the window: sums of its tasks' rates, means of their fractions."""

    operator: str
    kind: str
    tasks: int
    in_per_s: float
    out_per_s: float
    busy: float
    backpressure: float
    queued: int
    state_bytes: int | None = None  # its tasks' keyed state, estimated (keyed operators)


@dataclass(frozen=True)
class Channel(_Record):
    """Traffic from one task to another: one cell of the traffic matrix."""

    source: str
    target: str
    records_per_s: float
    bytes_per_s: float


@dataclass(frozen=True)
class Latency(_Record):
    """End-to-end latency at the sinks over the window; all zero when ``count`` is 0."""

    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    count: int = 0


@dataclass(frozen=True)
class WorkerUsage(_Record):
    worker: str
    cpu_percent: float
    rss_mb: float


TrafficMetric = Literal["bytes_per_s", "records_per_s"]


@dataclass(frozen=True)
class MetricsWindow:
    """The metrics window of one job (see the module docstring). ``job_id`` is as the REST
    response gives it (the database's integer id); ``samples`` counts worker snapshots."""

    job_id: int | str
    window_s: float
    samples: int
    tasks: tuple[TaskSample, ...]
    operators: tuple[OperatorSample, ...]
    traffic: tuple[Channel, ...]
    latency: Latency
    workers: tuple[WorkerUsage, ...]

    @classmethod
    def empty(cls, job_id: int | str, window_s: float = 0.0) -> MetricsWindow:
        """A window in which nothing reported (a job that just started)."""
        return cls(job_id, window_s, 0, (), (), (), Latency(), ())

    # -- per task and operator ----------------------------------------------------------------

    def task(self, task_id: str) -> TaskSample | None:
        return next((t for t in self.tasks if t.task == task_id), None)

    def tasks_of(self, operator: str) -> tuple[TaskSample, ...]:
        return tuple(t for t in self.tasks if t.operator == operator)

    def operator(self, name: str) -> OperatorSample | None:
        return next((o for o in self.operators if o.operator == name), None)

    def input_rate(self, operator: str) -> float:
        """Records per second into ``operator`` (0.0 when none of its tasks reported)."""
        return sum(t.in_per_s for t in self.tasks_of(operator))

    def output_rate(self, operator: str) -> float:
        return sum(t.out_per_s for t in self.tasks_of(operator))

    def queue_length(self, operator: str) -> int:
        """Records waiting at the operator's tasks (latest level)."""
        return sum(t.queue_length for t in self.tasks_of(operator))

    def task_loads(self, operator: str) -> dict[str, float]:
        """Records per second into each reporting task of ``operator``."""
        return {t.task: t.in_per_s for t in self.tasks_of(operator)}

    def key_group_loads(self, operator: str) -> dict[int, float]:
        """Records per second of each key group of ``operator``, summed over its tasks (a key
        group that moved during the window counts at both owners). Empty for non-keyed
        operators or when no count was reported."""
        loads: dict[int, float] = {}
        if self.window_s <= 0:
            return loads
        for t in self.tasks_of(operator):
            for g, n in t.key_groups.items():
                loads[g] = loads.get(g, 0.0) + n / self.window_s
        return dict(sorted(loads.items()))

    def key_group_state_bytes(self, operator: str) -> dict[int, int]:
        """Estimated bytes of keyed state of each key group of ``operator``, as its owner
        last reported it (groups of tasks that report no per-group sizes are missing)."""
        return {
            g: n for t in self.tasks_of(operator) for g, n in (t.state_key_groups or {}).items()
        }

    def source_lag(self, operator: str) -> dict[str, int]:
        """Records each partition of the partitioned source ``operator`` is behind the head
        of its input, as its reader last saw it, or for a source that is not partitioned,
        each task (a throttled generator's records due and not read yet); those whose lag
        is unknown are left out: what an autoscaler drains."""
        lags = {
            p: h["lag"]
            for t in self.tasks_of(operator)
            for p, h in (t.partitions or {}).items()
            if h.get("lag") is not None
        }
        lags.update({t.task: t.lag for t in self.tasks_of(operator) if t.lag is not None})
        return lags

    def stalled(self, operator: str) -> dict[str, str]:
        """Partitions of ``operator`` that cannot be read now, and why."""
        return {
            p: h["stalled"]
            for t in self.tasks_of(operator)
            for p, h in (t.partitions or {}).items()
            if h.get("stalled")
        }

    def state_bytes(self, operator: str) -> dict[str, int]:
        """Estimated bytes of keyed state of each reporting task of ``operator`` (what moving
        it would ship); empty for non-keyed operators."""
        return {t.task: t.state_bytes for t in self.tasks_of(operator) if t.state_bytes is not None}

    def processing_speeds(self, operator: str, min_busy: float = MIN_BUSY) -> dict[str, float]:
        """Records per busy second of each task of ``operator`` busy at least ``min_busy`` of
        the window (see :attr:`TaskSample.speed`); the others are left out."""
        return {
            t.task: s
            for t in self.tasks_of(operator)
            if (s := t.speed) is not None and t.busy >= min_busy
        }

    def hot_keys(self, operator: str) -> list[HotKey]:
        """The heaviest keys of ``operator``'s tasks, heaviest first (a key reported by two
        tasks, its group having moved during the window, is listed for each)."""
        return sorted(
            (h for t in self.tasks_of(operator) for h in t.hot_keys), key=lambda h: -h.per_s
        )

    def service_rate(self, operator: str) -> float | None:
        """Records one task of ``operator`` processes per busy second, over all its measured
        tasks (total input / total busy time), or None when none was busy enough."""
        measured = [t for t in self.tasks_of(operator) if t.speed is not None]
        busy = sum(t.busy for t in measured)
        return sum(t.in_per_s for t in measured) / busy if measured else None

    # -- traffic and workers -------------------------------------------------------------------

    def channel_rates(self, metric: TrafficMetric = "bytes_per_s") -> dict[tuple[str, str], float]:
        """``(source task, target task) -> rate`` for every channel that carried traffic."""
        return {(c.source, c.target): getattr(c, metric) for c in self.traffic}

    def traffic_matrix(
        self, tasks: Sequence[str] | None = None, metric: TrafficMetric = "bytes_per_s"
    ) -> np.ndarray:
        """Square matrix of ``metric`` from row task to column task, in the order of ``tasks``
        (default: every task seen in the traffic, sorted); channels to or from tasks not
        listed are left out."""
        order = list(tasks) if tasks is not None else _task_names(self.traffic)
        index = {t: i for i, t in enumerate(order)}
        matrix = np.zeros((len(order), len(order)))
        for c in self.traffic:
            if c.source in index and c.target in index:
                matrix[index[c.source], index[c.target]] += getattr(c, metric)
        return matrix

    def worker_usage(self, worker: str) -> WorkerUsage | None:
        return next((w for w in self.workers if w.worker == worker), None)

    # -- JSON ------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "window_s": self.window_s,
            "samples": self.samples,
            "tasks": [t.to_dict() for t in self.tasks],
            "operators": [o.to_dict() for o in self.operators],
            "traffic": [c.to_dict() for c in self.traffic],
            "latency": self.latency.to_dict(),
            "workers": [w.to_dict() for w in self.workers],
        }

    @classmethod
    def from_dict(cls, data: Any, path: str = "metrics") -> MetricsWindow:
        """Read the REST response's JSON; :class:`ViewError` names a bad field."""
        d = js.obj(data, path)

        def each(name: str, read: Any) -> tuple:
            items = js.array(js.field(d, name, path), f"{path}.{name}")
            return tuple(read(x, f"{path}.{name}[{i}]") for i, x in enumerate(items))

        job_id = js.field(d, "job_id", path)
        if not isinstance(job_id, int | str) or isinstance(job_id, bool):
            raise ViewError(f"{path}.job_id: expected an integer or a string, got {job_id!r}")
        return cls(
            job_id,
            js.number(js.field(d, "window_s", path), f"{path}.window_s"),
            js.integer(js.field(d, "samples", path), f"{path}.samples"),
            each("tasks", TaskSample.from_dict),
            each("operators", OperatorSample.from_dict),
            each("traffic", Channel.from_dict),
            Latency.from_dict(js.field(d, "latency", path), f"{path}.latency"),
            each("workers", WorkerUsage.from_dict),
        )


def _task_names(traffic: Iterable[Channel]) -> list[str]:
    return sorted({t for c in traffic for t in (c.source, c.target)})
