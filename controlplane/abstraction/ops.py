"""The atomic operations of docs/design.md (section 2) and the plans that group them.

Four operations, serialized with Trisk's names (and one of ours) in an ``"op"`` field:

- :class:`AssignWorkload` ``{"op": "assignWorkload", "operator", "workload"}``: the named
  tasks get exactly the given key groups (keyed) or weight (others); tasks not named keep
  theirs. A list value is key groups, a number is a weight.
- :class:`AssignResource` ``{"op": "assignResource", "operator", "task", "worker"}``: place a
  new task (empty workload, the operator's current logic), move an existing one, remove one
  (``worker: null``, only once it owns no work), or ask for a fresh worker (``"new"``).
- :class:`AssignLogic` ``{"op": "assignLogic", "operator", "tasks", "ref"}``: swap the logic
  of the listed tasks, or of ``"all"`` the operator's tasks at that point of the plan.
- :class:`SplitKey` ``{"op": "splitKey", "operator", "key", "tasks"}``: spread the records
  of one hot key of a combinable aggregation over the listed tasks (two or more), each
  folding its share into a partial result that the aggregation's merge adds up (TAG's
  key splitting, :mod:`runtime.aggregate`); ``tasks: []`` routes the key to its own key
  group again.

Constructors check the values that need no abstraction and raise :class:`InvalidPlan` (or
:class:`KeyGroupConflict` for a key group listed twice); ``from_dict`` raises
:class:`SchemaError` naming the field of a document of the wrong shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from . import _shape as shape
from .errors import InvalidPlan, KeyGroupConflict, PartitionConflict, SchemaError
from .parts import json_key, split_key

__all__ = [
    "MODES",
    "AssignLogic",
    "AssignResource",
    "AssignWorkload",
    "Op",
    "Plan",
    "SplitKey",
    "op_from_dict",
]

MODES = ("pause", "fluid")


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidPlan(f"{what} must be a non-empty string, got {value!r}")
    return value


@dataclass(frozen=True)
class AssignWorkload:
    """Give the named tasks of ``operator`` exactly this workload.

    ``workload`` maps task ids to key groups (a list/tuple of ints, stored sorted) for a
    keyed operator, to partitions (a list of names, stored sorted) for a partitioned
    source, or to a weight (a number >= 0, stored as float) for the others. Treat it as
    read-only. Raises :class:`InvalidPlan` for an empty or mixed mapping, a negative or
    non-finite weight, a key group that is not an int; :class:`KeyGroupConflict` or
    :class:`PartitionConflict` for one listed twice (for one task or for two).
    """

    operator: str
    workload: Mapping[str, tuple[int, ...]] | Mapping[str, tuple[str, ...]] | Mapping[str, float]

    def __post_init__(self) -> None:
        _name(self.operator, "assignWorkload: operator")
        if not isinstance(self.workload, Mapping) or not self.workload:
            raise InvalidPlan(
                f"assignWorkload on {self.operator!r}: workload must be a non-empty "
                "{task: [key groups]} or {task: weight} mapping"
            )
        normalized: dict[str, Any] = {}
        owner: dict[Any, str] = {}
        for task, value in self.workload.items():
            where = f"assignWorkload on {self.operator!r}, task {task!r}"
            _name(task, "assignWorkload: task id")
            if isinstance(value, int | float) and not isinstance(value, bool):
                if not math.isfinite(value) or value < 0:
                    raise InvalidPlan(
                        f"{where}: weight must be a finite number >= 0, got {value!r}"
                    )
                normalized[task] = float(value)
                continue
            if not isinstance(value, list | tuple | set | frozenset | range):
                raise InvalidPlan(
                    f"{where}: expected key groups (a list of ints) or a weight, got {value!r}"
                )
            names = bool(value) and all(isinstance(g, str) for g in value)
            for g in value:
                if not names and (not isinstance(g, int) or isinstance(g, bool)):
                    raise InvalidPlan(
                        f"{where}: {g!r} is neither a key group (an int) nor, with the "
                        "others, a partition name (a string)"
                    )
                if g in owner:
                    other = "twice" if owner[g] == task else f"for tasks {owner[g]!r} and {task!r}"
                    what = f"partition {g!r}" if names else f"key group {g}"
                    conflict = PartitionConflict if names else KeyGroupConflict
                    raise conflict(f"assignWorkload on {self.operator!r}: {what} is listed {other}")
                owner[g] = task
            normalized[task] = tuple(sorted(value))
        kinds = {_kind_of(v) for v in normalized.values()} - {"nothing"}
        if len(kinds) > 1:
            raise InvalidPlan(
                f"assignWorkload on {self.operator!r}: mixes "
                + " and ".join(k.replace("_", " ") for k in sorted(kinds))
            )
        object.__setattr__(self, "workload", normalized)

    def __hash__(self) -> int:
        return hash((self.operator, tuple(self.workload.items())))

    @property
    def kind(self) -> str:
        """What the workload is: ``key_groups``, ``partitions`` or ``weights`` (a plan that
        empties tasks only, ``[]`` each, counts as key groups)."""
        kinds = {_kind_of(v) for v in self.workload.values()} - {"nothing"}
        return kinds.pop() if kinds else "key_groups"

    @property
    def keyed(self) -> bool:
        """True if the workload is key groups."""
        return self.kind == "key_groups"

    def describe(self) -> str:
        return f"assignWorkload on {self.operator!r}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": "assignWorkload",
            "operator": self.operator,
            "workload": {
                t: list(v) if isinstance(v, tuple) else v for t, v in self.workload.items()
            },
        }

    @classmethod
    def from_dict(cls, data: Any, path: str = "op") -> AssignWorkload:
        d = shape.obj(data, path, ("op", "operator", "workload"))
        workload = shape.mapping(d["workload"], f"{path}.workload")
        for task, value in workload.items():
            if isinstance(value, list | tuple):
                names = bool(value) and all(isinstance(g, str) for g in value)
                for i, g in enumerate(value):
                    if names:
                        shape.string(g, f"{path}.workload[{task!r}][{i}]")
                    else:
                        shape.integer(g, f"{path}.workload[{task!r}][{i}]")
            else:
                shape.number(value, f"{path}.workload[{task!r}]")
        return cls(shape.string(d["operator"], f"{path}.operator"), dict(workload))


def _kind_of(value: Any) -> str:
    if isinstance(value, float):
        return "weights"
    if not value:
        return "nothing"
    return "partitions" if isinstance(value[0], str) else "key_groups"


@dataclass(frozen=True)
class AssignResource:
    """Place, move or remove one task of ``operator``.

    ``worker`` is a worker id (place ``task`` there, creating it if it does not exist yet),
    ``None`` (remove ``task``: it must own no work by then) or ``"new"`` (a fresh worker
    from the backend, represented by a placeholder ``"new-<k>"`` that later operations of
    the same plan may name and that the coordinator substitutes).
    """

    operator: str
    task: str
    worker: str | None

    def __post_init__(self) -> None:
        _name(self.operator, "assignResource: operator")
        _name(self.task, f"assignResource on {self.operator!r}: task")
        if self.worker is not None:
            _name(self.worker, f"assignResource of {self.task!r}: worker (or null to remove)")

    def describe(self) -> str:
        where = "remove" if self.worker is None else f"to worker {self.worker!r}"
        return f"assignResource {self.task!r} {where}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": "assignResource",
            "operator": self.operator,
            "task": self.task,
            "worker": self.worker,
        }

    @classmethod
    def from_dict(cls, data: Any, path: str = "op") -> AssignResource:
        d = shape.obj(data, path, ("op", "operator", "task", "worker"))
        return cls(
            shape.string(d["operator"], f"{path}.operator"),
            shape.string(d["task"], f"{path}.task"),
            shape.opt_string(d["worker"], f"{path}.worker"),
        )


@dataclass(frozen=True)
class AssignLogic:
    """Swap the logic of some tasks of ``operator`` (a tuple of task ids, no duplicates) or of
    ``"all"`` of them, to the callable named by ``ref``; their logic version becomes one more
    than the operator's highest."""

    operator: str
    tasks: tuple[str, ...] | Literal["all"]
    ref: str

    def __post_init__(self) -> None:
        _name(self.operator, "assignLogic: operator")
        _name(self.ref, f"assignLogic on {self.operator!r}: ref")
        if self.tasks == "all":
            return
        if isinstance(self.tasks, str) or not isinstance(self.tasks, list | tuple):
            raise InvalidPlan(
                f"assignLogic on {self.operator!r}: tasks must be a list of task ids or 'all'"
            )
        tasks = tuple(_name(t, f"assignLogic on {self.operator!r}: task id") for t in self.tasks)
        if not tasks:
            raise InvalidPlan(
                f"assignLogic on {self.operator!r}: no tasks listed (use 'all' for every task)"
            )
        if len(set(tasks)) != len(tasks):
            raise InvalidPlan(f"assignLogic on {self.operator!r}: a task is listed twice")
        object.__setattr__(self, "tasks", tasks)

    def describe(self) -> str:
        return f"assignLogic on {self.operator!r}"

    def to_dict(self) -> dict[str, Any]:
        tasks = self.tasks if self.tasks == "all" else list(self.tasks)
        return {"op": "assignLogic", "operator": self.operator, "tasks": tasks, "ref": self.ref}

    @classmethod
    def from_dict(cls, data: Any, path: str = "op") -> AssignLogic:
        d = shape.obj(data, path, ("op", "operator", "tasks", "ref"))
        tasks = d["tasks"]
        if tasks != "all":
            tasks = tuple(
                shape.string(t, f"{path}.tasks[{i}]")
                for i, t in enumerate(shape.array(tasks, f"{path}.tasks"))
            )
        return cls(
            shape.string(d["operator"], f"{path}.operator"),
            tasks,
            shape.string(d["ref"], f"{path}.ref"),
        )


@dataclass(frozen=True)
class SplitKey:
    """Split ``key`` of the combinable aggregation ``operator`` over ``tasks`` (two or more
    distinct task ids; each holds a part of the key in one of its key groups), or, with
    no tasks, stop splitting it. ``key`` is a string, number, boolean, None or a tuple of
    those (an array in JSON)."""

    operator: str
    key: Any
    tasks: tuple[str, ...]

    def __post_init__(self) -> None:
        _name(self.operator, "splitKey: operator")
        try:
            key = split_key(self.key, f"splitKey on {self.operator!r}: key")
        except SchemaError as exc:
            raise InvalidPlan(str(exc)) from None
        if isinstance(self.tasks, str) or not isinstance(self.tasks, list | tuple):
            raise InvalidPlan(f"splitKey on {self.operator!r}: tasks must be a list of task ids")
        tasks = tuple(_name(t, f"splitKey on {self.operator!r}: task id") for t in self.tasks)
        if len(set(tasks)) != len(tasks):
            raise InvalidPlan(f"splitKey on {self.operator!r}: a task is listed twice")
        if len(tasks) == 1:
            raise InvalidPlan(
                f"splitKey on {self.operator!r}: a key splits over two tasks or more "
                "(tasks: [] stops splitting it)"
            )
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "tasks", tasks)

    def describe(self) -> str:
        return f"splitKey {self.key!r} of {self.operator!r}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": "splitKey",
            "operator": self.operator,
            "key": json_key(self.key),
            "tasks": list(self.tasks),
        }

    @classmethod
    def from_dict(cls, data: Any, path: str = "op") -> SplitKey:
        d = shape.obj(data, path, ("op", "operator", "key", "tasks"))
        return cls(
            shape.string(d["operator"], f"{path}.operator"),
            split_key(d["key"], f"{path}.key"),
            tuple(
                shape.string(t, f"{path}.tasks[{i}]")
                for i, t in enumerate(shape.array(d["tasks"], f"{path}.tasks"))
            ),
        )


Op = AssignWorkload | AssignResource | AssignLogic | SplitKey
_OPS: dict[str, type[AssignWorkload | AssignResource | AssignLogic | SplitKey]] = {
    "assignWorkload": AssignWorkload,
    "assignResource": AssignResource,
    "assignLogic": AssignLogic,
    "splitKey": SplitKey,
}


def op_from_dict(data: Any, path: str = "op") -> Op:
    """One operation from its JSON form; :class:`SchemaError` for a bad shape or op name."""
    d = shape.obj(
        data, path, ("op",), ("operator", "workload", "task", "worker", "tasks", "ref", "key")
    )
    name = d["op"]
    if name not in _OPS:
        raise SchemaError(f"{path}.op: {name!r} is not one of {', '.join(_OPS)}")
    return _OPS[name].from_dict(d, path)


@dataclass(frozen=True)
class Plan:
    """Operations against ``base_version``, validated as a whole and applied as one
    reconfiguration (see :func:`~controlplane.abstraction.apply_plan`).

    ``mode`` is ``"pause"`` (affected tasks pause) or ``"fluid"`` (only records of moving key
    groups wait; no task gives or gains more than ``batch_size`` key groups a step, all at
    once when None); both are carried for the coordinator, not interpreted here. A plan
    with no operations is falsy: the helpers return one when there is nothing to do, and
    ``apply_plan`` refuses it.
    Raises :class:`InvalidPlan` for a bad version, mode, batch size or operation.
    """

    base_version: int
    ops: tuple[Op, ...]
    mode: Literal["pause", "fluid"] = "pause"
    batch_size: int | None = None
    # Partitioned source -> partitions its first task found since the base version: the
    # plan may give them out (only the coordinator's discovery makes such plans; JSON
    # plans cannot, since the control plane cannot check that a partition exists).
    discovered: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (
            not isinstance(self.base_version, int)
            or isinstance(self.base_version, bool)
            or self.base_version < 1
        ):
            raise InvalidPlan(f"base_version must be an int >= 1, got {self.base_version!r}")
        if not isinstance(self.ops, list | tuple):
            raise InvalidPlan(f"ops must be a list of operations, got {type(self.ops).__name__}")
        for i, op in enumerate(self.ops):
            if not isinstance(op, AssignWorkload | AssignResource | AssignLogic | SplitKey):
                raise InvalidPlan(f"ops[{i}] is not an operation: {op!r}")
        if self.mode not in MODES:
            raise InvalidPlan(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.batch_size is not None:
            if (
                not isinstance(self.batch_size, int)
                or isinstance(self.batch_size, bool)
                or self.batch_size < 1
            ):
                raise InvalidPlan(
                    f"batch_size must be an int >= 1 or null, got {self.batch_size!r}"
                )
            if self.mode != "fluid":
                raise InvalidPlan(
                    "batch_size applies to mode 'fluid' only (pause mode moves everything at once)"
                )
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(
            self, "discovered", {o: tuple(ps) for o, ps in dict(self.discovered).items()}
        )

    def __hash__(self) -> int:
        return hash((self.base_version, self.ops, self.mode, self.batch_size))

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def operators(self) -> tuple[str, ...]:
        """The operators the plan touches, in order of first mention."""
        return tuple(dict.fromkeys(op.operator for op in self.ops))

    def to_dict(self) -> dict[str, Any]:
        return {
            "base_version": self.base_version,
            "ops": [op.to_dict() for op in self.ops],
            "mode": self.mode,
            "batch_size": self.batch_size,
            **({"discovered": {o: list(ps) for o, ps in self.discovered.items()}}
               if self.discovered else {}),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        """A plan from JSON (``mode`` and ``batch_size`` optional); :class:`SchemaError` for a
        bad shape, :class:`InvalidPlan` for bad values."""
        d = shape.obj(data, "plan", ("base_version", "ops"), ("mode", "batch_size"))
        ops = shape.array(d["ops"], "ops")
        return cls(
            shape.integer(d["base_version"], "base_version"),
            tuple(op_from_dict(x, f"ops[{i}]") for i, x in enumerate(ops)),
            shape.string(d.get("mode", "pause"), "mode"),  # type: ignore[arg-type]
            shape.opt_integer(d.get("batch_size"), "batch_size"),
        )
