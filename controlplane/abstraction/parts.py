"""The parts of the abstraction: tasks (logic, workload, resources), inputs and workers.

Frozen values with a JSON form: ``to_dict()`` gives plain JSON (lists, not tuples) and
``from_dict(data, path)`` reads it back equal, raising :class:`SchemaError` whose message
starts with ``path`` for a document of the wrong shape. See :mod:`.model` for operators
and the whole :class:`~controlplane.abstraction.model.Abstraction`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import _shape as shape
from .errors import SchemaError

__all__ = [
    "DEFAULT_SLOTS",
    "DESIGN_KINDS",
    "NEW_WORKER",
    "PARTITIONINGS",
    "PLACEABLE_STATUSES",
    "PLACEHOLDER_STATUS",
    "Input",
    "Logic",
    "Resources",
    "Task",
    "Worker",
    "Workload",
    "current_logic",
    "json_key",
    "next_placeholder",
    "split_key",
    "task_index",
]

DEFAULT_SLOTS = 64  # tasks of one job a worker may host unless it says otherwise
NEW_WORKER = "new"  # the worker of assignResource that asks the backend for a fresh one
PLACEHOLDER_STATUS = "pending"  # status of a requested worker, until the coordinator has it
PLACEABLE_STATUSES = frozenset({"alive", PLACEHOLDER_STATUS})  # workers that may get tasks
# runtime kind (JSON "transform") -> kind of docs/design.md, section 2 (JSON "kind")
DESIGN_KINDS: Mapping[str, str] = {
    "source": "source",
    "map": "map",
    "flat_map": "map",
    "filter": "map",
    "keyed": "keyed",
    "sink": "sink",
}
PARTITIONINGS = ("forward", "rebalance", "key_groups", "broadcast")
_INDEX = re.compile(r"0|[1-9][0-9]*")


def split_key(value: Any, path: str) -> Any:
    """A key as a plan names it in JSON (a string, number, boolean, null, or an array of
    those for a tuple key), as the runtime sees it (arrays become tuples); SchemaError
    for anything else (a key the runtime could not hash the same way everywhere)."""
    if isinstance(value, list | tuple):
        return tuple(split_key(v, f"{path}[{i}]") for i, v in enumerate(value))
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return shape.number(value, path)
    raise SchemaError(
        f"{path}: a key is a string, number, boolean, null or an array of those, "
        f"got {shape.json_type(value)}"
    )


def json_key(key: Any) -> Any:
    """``key`` in JSON: tuples as arrays."""
    return [json_key(k) for k in key] if isinstance(key, tuple) else key


def task_index(task_id: str, operator: str) -> int | None:
    """The index of ``task_id`` if it is ``"<operator>-<index>"`` (no leading zeros), else None."""
    prefix = f"{operator}-"
    if not task_id.startswith(prefix) or not _INDEX.fullmatch(task_id[len(prefix) :]):
        return None
    return int(task_id[len(prefix) :])


def next_placeholder(taken: Iterable[str]) -> str:
    """The id ``"new-<k>"`` (smallest k >= 1) not in ``taken``: the id a requested worker gets."""
    taken = set(taken)
    k = 1
    while f"{NEW_WORKER}-{k}" in taken:
        k += 1
    return f"{NEW_WORKER}-{k}"


def current_logic(tasks: Iterable[Task]) -> Logic:
    """The logic most of ``tasks`` run (ties: the newest version); ValueError if empty."""
    counts = Counter(t.logic for t in tasks)
    return max(counts, key=lambda lg: (counts[lg], lg.version, lg.ref))


@dataclass(frozen=True, slots=True)
class Logic:
    """The callable a task runs: ``ref`` (``module:callable`` or ``code:<id>:callable``) and a
    version that grows by one each time ``assignLogic`` changes the operator's logic."""

    ref: str
    version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "version": self.version}

    @classmethod
    def from_dict(cls, data: Any, path: str = "logic") -> Logic:
        d = shape.obj(data, path, ("ref", "version"))
        return cls(
            shape.string(d["ref"], f"{path}.ref"), shape.integer(d["version"], f"{path}.version", 1)
        )


@dataclass(frozen=True, slots=True)
class Workload:
    """What a task owns: ``key_groups`` (keyed operators; sorted), ``partitions`` (tasks of
    a partitioned source: the partitions it reads; sorted) or ``weight`` (others: its
    share of records on rebalance edges). Exactly one of the three is set."""

    key_groups: tuple[int, ...] | None = None
    weight: float | None = None
    partitions: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        given = [x is not None for x in (self.key_groups, self.weight, self.partitions)]
        if sum(given) != 1:
            raise SchemaError("workload: set exactly one of key_groups, partitions and weight")
        if self.key_groups is not None:
            object.__setattr__(self, "key_groups", tuple(sorted(self.key_groups)))
        elif self.partitions is not None:
            object.__setattr__(self, "partitions", tuple(sorted(self.partitions)))
        else:
            object.__setattr__(self, "weight", float(self.weight))  # type: ignore[arg-type]

    @property
    def keyed(self) -> bool:
        return self.key_groups is not None

    @property
    def partitioned(self) -> bool:
        return self.partitions is not None

    @property
    def owns_work(self) -> bool:
        """True while the task owns key groups, partitions or a non-zero weight (it cannot
        be removed)."""
        if self.keyed:
            return bool(self.key_groups)
        if self.partitioned:
            return bool(self.partitions)
        return bool(self.weight)

    def to_dict(self) -> dict[str, Any]:
        if self.key_groups is not None:
            return {"key_groups": list(self.key_groups)}
        if self.partitions is not None:
            return {"partitions": list(self.partitions)}
        return {"weight": self.weight}

    @classmethod
    def from_dict(cls, data: Any, path: str = "workload") -> Workload:
        d = shape.obj(data, path, (), ("key_groups", "weight", "partitions"))
        if len(d) != 1:
            raise SchemaError(
                f"{path}: expected exactly one of 'key_groups', 'partitions' and 'weight'"
            )
        if "weight" in d:
            return cls(weight=shape.number(d["weight"], f"{path}.weight"))
        if "partitions" in d:
            names = shape.array(d["partitions"], f"{path}.partitions")
            return cls(
                partitions=tuple(
                    shape.string(p, f"{path}.partitions[{i}]") for i, p in enumerate(names)
                )
            )
        groups = shape.array(d["key_groups"], f"{path}.key_groups")
        return cls(
            key_groups=tuple(
                shape.integer(g, f"{path}.key_groups[{i}]") for i, g in enumerate(groups)
            )
        )


@dataclass(frozen=True, slots=True)
class Resources:
    """Where a task runs: its worker and that worker's host, cpus and memory."""

    worker: str
    host: str
    cpus: float
    memory_mb: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "host": self.host,
            "cpus": self.cpus,
            "memory_mb": self.memory_mb,
        }

    @classmethod
    def from_dict(cls, data: Any, path: str = "resources") -> Resources:
        d = shape.obj(data, path, ("worker", "host", "cpus", "memory_mb"))
        return cls(
            shape.string(d["worker"], f"{path}.worker"),
            _host(d["host"], f"{path}.host"),
            shape.number(d["cpus"], f"{path}.cpus"),
            shape.integer(d["memory_mb"], f"{path}.memory_mb", 0),
        )


def _host(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise SchemaError(f"{path}: expected a string, got {shape.json_type(value)}")
    return value


@dataclass(frozen=True, slots=True)
class Task:
    """One task: a stable id ``"<operator>-<index>"``, its logic, workload and resources."""

    id: str
    logic: Logic
    workload: Workload
    resources: Resources

    @property
    def operator(self) -> str:
        return self.id.rpartition("-")[0]

    @property
    def index(self) -> int:
        return int(self.id.rpartition("-")[2])

    @property
    def worker(self) -> str:
        return self.resources.worker

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "logic": self.logic.to_dict(),
            "workload": self.workload.to_dict(),
            "resources": self.resources.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any, path: str = "task") -> Task:
        d = shape.obj(data, path, ("id", "logic", "workload", "resources"))
        return cls(
            shape.string(d["id"], f"{path}.id"),
            Logic.from_dict(d["logic"], f"{path}.logic"),
            Workload.from_dict(d["workload"], f"{path}.workload"),
            Resources.from_dict(d["resources"], f"{path}.resources"),
        )


@dataclass(frozen=True, slots=True)
class Input:
    """One input of an operator: the upstream operator and the edge's partitioning."""

    upstream: str
    partitioning: str = "forward"

    def to_dict(self) -> dict[str, Any]:
        return {"upstream": self.upstream, "partitioning": self.partitioning}

    @classmethod
    def from_dict(cls, data: Any, path: str = "input") -> Input:
        d = shape.obj(data, path, ("upstream", "partitioning"))
        part = shape.string(d["partitioning"], f"{path}.partitioning")
        if part not in PARTITIONINGS:
            raise SchemaError(
                f"{path}.partitioning: {part!r} is not one of {', '.join(PARTITIONINGS)}"
            )
        return cls(shape.string(d["upstream"], f"{path}.upstream"), part)


@dataclass(frozen=True, slots=True)
class Worker:
    """A worker the job may use. ``slots`` is the most tasks of this job it may host (the
    capacity rule); a worker requested with ``"new"`` appears as ``"new-<k>"`` with status
    ``"pending"`` until the coordinator substitutes the real one. ``executor_id`` is the
    Spark executor hosting the worker (spark backend; absent from the JSON otherwise), so
    placement policies see the machine layout Spark gave."""

    id: str
    host: str
    cpus: float
    memory_mb: int
    backend: str
    status: str = "alive"
    slots: int = DEFAULT_SLOTS
    executor_id: str | None = None

    @property
    def placeholder(self) -> bool:
        return self.status == PLACEHOLDER_STATUS

    def resources(self) -> Resources:
        return Resources(self.id, self.host, self.cpus, self.memory_mb)

    @classmethod
    def from_info(cls, info: Any, *, backend: str = "local", slots: int = DEFAULT_SLOTS) -> Worker:
        """From any object with ``id, host, cpus, memory_mb`` (e.g. the coordinator's
        ``WorkerInfo``); ``backend``, ``status``, ``slots`` and ``executor_id`` are read
        when present."""
        return cls(
            info.id,
            info.host,
            float(info.cpus),
            int(info.memory_mb),
            getattr(info, "backend", backend),
            getattr(info, "status", "alive"),
            getattr(info, "slots", slots),
            getattr(info, "executor_id", None),
        )

    def to_dict(self) -> dict[str, Any]:
        d = {
            "id": self.id,
            "host": self.host,
            "cpus": self.cpus,
            "memory_mb": self.memory_mb,
            "backend": self.backend,
            "status": self.status,
            "slots": self.slots,
        }
        if self.executor_id is not None:
            d["executor_id"] = self.executor_id
        return d

    @classmethod
    def from_dict(cls, data: Any, path: str = "worker") -> Worker:
        d = shape.obj(
            data,
            path,
            ("id", "host", "cpus", "memory_mb", "backend", "status"),
            ("slots", "executor_id"),
        )
        executor = d.get("executor_id")
        return cls(
            shape.string(d["id"], f"{path}.id"),
            _host(d["host"], f"{path}.host"),
            shape.number(d["cpus"], f"{path}.cpus"),
            shape.integer(d["memory_mb"], f"{path}.memory_mb", 0),
            _host(d["backend"], f"{path}.backend"),
            shape.string(d["status"], f"{path}.status"),
            shape.integer(d.get("slots", DEFAULT_SLOTS), f"{path}.slots", 0),
            None if executor is None else shape.string(executor, f"{path}.executor_id"),
        )
