"""The task-centric abstraction of a job (docs/design.md, section 2): frozen, versioned, JSON-able.

An :class:`Abstraction` is one version of a deployed job: its operators, each with its
tasks (logic, workload, resources; see :mod:`.parts`), and the workers the job may use.
Every applied plan makes version N+1 (see :func:`controlplane.abstraction.apply_plan`);
objects are never mutated. ``to_dict()`` gives plain JSON (lists, not tuples) and
``from_dict()`` reads it back equal to the original; ``from_dict`` checks the shape only
(see :func:`~controlplane.abstraction.check_abstraction` for the invariants).

Task ids are ``"<operator>-<index>"`` (operator names never contain ``-``), and the tasks of
an operator are kept sorted by index.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from runtime.dataflow import JobGraph, logic_ref

from . import _shape as shape
from .errors import SchemaError, UnknownOperator, UnknownTask, UnknownWorker
from .parts import (
    DESIGN_KINDS,
    NEW_WORKER,
    Input,
    Logic,
    Task,
    Worker,
    Workload,
    current_logic,
    json_key,
    split_key,
    task_index,
)

if TYPE_CHECKING:
    from runtime.layout import Layout

__all__ = ["Abstraction", "Operator", "from_graph"]


@dataclass(frozen=True)
class Operator:
    """One operator: ``kind`` is the runtime kind (source, map, flat_map, filter, keyed,
    sink); :attr:`design_kind` is docs/design.md's (source, map, keyed, sink). ``max_parallelism``
    is the number of key groups of a keyed operator and None for the others.

    Raises :class:`SchemaError` for an unknown kind, a task id that is not
    ``"<name>-<index>"``, a duplicate index or a workload of the wrong kind. Tasks are
    stored sorted by index.
    """

    name: str
    kind: str
    max_parallelism: int | None
    inputs: tuple[Input, ...]
    tasks: tuple[Task, ...]
    # The partial side of a combinable aggregation (runtime.aggregate) and its split keys:
    # (key, the key groups of its parts, the home group first), in the order split.
    combinable: bool = False
    split_keys: tuple[tuple[Any, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        where = f"operator {self.name!r}"
        if self.split_keys and not self.combinable:
            raise SchemaError(f"{where}: only a combinable aggregation splits keys")
        object.__setattr__(self, "split_keys", tuple((k, tuple(gs)) for k, gs in self.split_keys))
        if not isinstance(self.name, str) or not self.name or "-" in self.name:
            raise SchemaError(f"{where}: a name is a non-empty string without '-'")
        if self.kind not in DESIGN_KINDS:
            raise SchemaError(
                f"{where}: unknown kind {self.kind!r}; one of {', '.join(DESIGN_KINDS)}"
            )
        if self.keyed != isinstance(self.max_parallelism, int):
            raise SchemaError(f"{where}: max_parallelism must be an int for keyed operators only")
        indexed = []
        for t in self.tasks:
            index = task_index(t.id, self.name)
            if index is None:
                raise SchemaError(f"{where}: task id {t.id!r} is not '{self.name}-<index>'")
            if t.workload.keyed != self.keyed:
                want = "key groups" if self.keyed else "a weight or partitions"
                raise SchemaError(f"{where}: task {t.id!r} must own {want}")
            if t.workload.partitioned and self.kind != "source":
                raise SchemaError(f"{where}: task {t.id!r} owns partitions, but only sources do")
            indexed.append((index, t))
        if len({t.workload.partitioned for t in self.tasks}) > 1:
            raise SchemaError(f"{where}: either every task owns partitions or none does")
        indexed.sort(key=lambda pair: pair[0])
        for (a, _), (b, t) in itertools.pairwise(indexed):
            if a == b:
                raise SchemaError(f"{where}: task {t.id!r} appears twice")
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "tasks", tuple(t for _, t in indexed))

    @property
    def design_kind(self) -> str:
        return DESIGN_KINDS[self.kind]

    @property
    def keyed(self) -> bool:
        return self.kind == "keyed"

    @property
    def partitioned(self) -> bool:
        """A partitioned source: its tasks own partitions."""
        return bool(self.tasks) and self.tasks[0].workload.partitioned

    @property
    def task_ids(self) -> tuple[str, ...]:
        return tuple(t.id for t in self.tasks)

    @property
    def parallelism(self) -> int:
        return len(self.tasks)

    def current_logic(self) -> Logic:
        """The logic new tasks of this operator get (see :func:`current_logic`)."""
        return current_logic(self.tasks)

    def owner_of_groups(self) -> dict[int, str]:
        """Key group -> the task owning it (empty unless keyed)."""
        return {g: t.id for t in self.tasks for g in t.workload.key_groups or ()}

    def owner_of_key(self, key: Any) -> str:
        """The task owning ``key``'s own key group (keyed operators)."""
        from runtime.keygroups import key_group

        return self.owner_of_groups()[key_group(key, self.max_parallelism or 1)]

    def splits(self) -> dict[Any, tuple[int, ...]]:
        """Split key -> the key groups of its parts (empty: no key is split)."""
        return dict(self.split_keys)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "name": self.name,
            "kind": self.design_kind,
            "transform": self.kind,
            "max_parallelism": self.max_parallelism,
            "inputs": [i.to_dict() for i in self.inputs],
            "tasks": [t.to_dict() for t in self.tasks],
        }
        if self.combinable:
            d["combinable"] = True
            d["split_keys"] = [
                {"key": json_key(k), "groups": list(gs)} for k, gs in self.split_keys
            ]
        return d

    @classmethod
    def from_dict(cls, data: Any, path: str = "operator") -> Operator:
        d = shape.obj(
            data,
            path,
            ("name", "kind", "transform", "max_parallelism", "inputs", "tasks"),
            ("combinable", "split_keys"),
        )
        splits = []
        for i, x in enumerate(shape.array(d.get("split_keys", []), f"{path}.split_keys")):
            e = shape.obj(x, f"{path}.split_keys[{i}]", ("key", "groups"))
            groups = shape.array(e["groups"], f"{path}.split_keys[{i}].groups")
            splits.append(
                (
                    split_key(e["key"], f"{path}.split_keys[{i}].key"),
                    tuple(
                        shape.integer(g, f"{path}.split_keys[{i}].groups[{j}]")
                        for j, g in enumerate(groups)
                    ),
                )
            )
        kind = shape.string(d["transform"], f"{path}.transform")
        if DESIGN_KINDS.get(kind, d["kind"]) != d["kind"]:
            raise SchemaError(f"{path}.kind: {d['kind']!r} does not match transform {kind!r}")
        try:
            return cls(
                shape.string(d["name"], f"{path}.name"),
                kind,
                shape.opt_integer(d["max_parallelism"], f"{path}.max_parallelism", 1),
                tuple(
                    Input.from_dict(x, f"{path}.inputs[{i}]")
                    for i, x in enumerate(shape.array(d["inputs"], f"{path}.inputs"))
                ),
                tuple(
                    Task.from_dict(x, f"{path}.tasks[{i}]")
                    for i, x in enumerate(shape.array(d["tasks"], f"{path}.tasks"))
                ),
                shape.boolean(d.get("combinable", False), f"{path}.combinable"),
                tuple(splits),
            )
        except SchemaError as exc:
            if str(exc).startswith(path):
                raise
            raise SchemaError(f"{path}: {exc}") from None


@dataclass(frozen=True)
class Abstraction:
    """One version of a job's task-centric abstraction (operators in topological order).

    Lookups raise :class:`UnknownOperator`, :class:`UnknownTask` or :class:`UnknownWorker`
    naming what was asked for. Construction raises :class:`SchemaError` for duplicate
    operator names or worker ids.
    """

    job_id: str
    name: str
    version: int
    status: str
    operators: tuple[Operator, ...]
    workers: tuple[Worker, ...]
    _ops: Mapping[str, Operator] = field(init=False, repr=False, compare=False)
    _tasks: Mapping[str, Task] = field(init=False, repr=False, compare=False)
    _workers: Mapping[str, Worker] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "operators", tuple(self.operators))
        object.__setattr__(self, "workers", tuple(self.workers))
        ops = {op.name: op for op in self.operators}
        workers = {w.id: w for w in self.workers}
        if len(ops) != len(self.operators):
            raise SchemaError(f"job {self.job_id!r}: an operator name appears twice")
        if len(workers) != len(self.workers):
            raise SchemaError(f"job {self.job_id!r}: a worker id appears twice")
        object.__setattr__(self, "_ops", ops)
        object.__setattr__(self, "_tasks", {t.id: t for op in self.operators for t in op.tasks})
        object.__setattr__(self, "_workers", workers)

    # -- lookups -----------------------------------------------------------------------------

    def operator(self, name: str) -> Operator:
        try:
            return self._ops[name]
        except (KeyError, TypeError):
            known = ", ".join(self._ops)
            raise UnknownOperator(
                f"job {self.job_id!r} has no operator {name!r} (operators: {known})"
            ) from None

    def task(self, task_id: str) -> Task:
        try:
            return self._tasks[task_id]
        except (KeyError, TypeError):
            raise UnknownTask(f"job {self.job_id!r} has no task {task_id!r}") from None

    def worker(self, worker_id: str) -> Worker:
        try:
            return self._workers[worker_id]
        except (KeyError, TypeError):
            known = ", ".join(self._workers) or "none"
            raise UnknownWorker(
                f"job {self.job_id!r} has no worker {worker_id!r} (workers: {known})"
            ) from None

    def has_task(self, task_id: str) -> bool:
        return task_id in self._tasks

    def operator_of(self, task_id: str) -> Operator:
        return self._ops[self.task(task_id).operator]

    def tasks_on(self, worker_id: str) -> tuple[Task, ...]:
        """The job's tasks hosted by ``worker_id`` (empty for an idle or unknown worker)."""
        return tuple(t for t in self._tasks.values() if t.worker == worker_id)

    def owner_of(self, operator: str) -> dict[int, str]:
        """Key group -> owning task id of a keyed operator (empty for others)."""
        return self.operator(operator).owner_of_groups()

    def upstream(self, operator: str) -> tuple[tuple[Operator, Input], ...]:
        """The operators ``operator`` reads from, with the input of each edge."""
        return tuple((self._ops[i.upstream], i) for i in self.operator(operator).inputs)

    def downstream(self, operator: str) -> tuple[tuple[Operator, Input], ...]:
        """The operators reading from ``operator``, with the input of each edge."""
        self.operator(operator)
        return tuple((op, i) for op in self.operators for i in op.inputs if i.upstream == operator)

    def forward_group(self, operator: str) -> tuple[str, ...]:
        """``operator`` and every operator linked to it through forward edges (either
        direction, transitively), in topological order: they must keep equal parallelism."""
        group, todo = {operator}, [operator]
        while todo:
            name = todo.pop()
            linked = [u.name for u, i in self.upstream(name) if i.partitioning == "forward"]
            linked += [d.name for d, i in self.downstream(name) if i.partitioning == "forward"]
            for other in linked:
                if other not in group:
                    group.add(other)
                    todo.append(other)
        return tuple(op.name for op in self.operators if op.name in group)

    def workers_to_start(self) -> tuple[str, ...]:
        """The ``new-<k>`` placeholder workers that tasks are placed on: carrying out a
        plan that leads here starts one worker for each."""
        used = {t.resources.worker for op in self.operators for t in op.tasks}
        return tuple(
            w.id
            for w in self.workers
            if w.placeholder and w.id.startswith(f"{NEW_WORKER}-") and w.id in used
        )

    def replace(self, **changes: Any) -> Abstraction:
        return replace(self, **changes)

    # -- JSON --------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": {
                "id": self.job_id,
                "name": self.name,
                "version": self.version,
                "status": self.status,
            },
            "operators": [op.to_dict() for op in self.operators],
            "workers": [w.to_dict() for w in self.workers],
        }

    @classmethod
    def from_dict(cls, data: Any) -> Abstraction:
        """Read a document made by :meth:`to_dict`; :class:`SchemaError` names a bad field."""
        d = shape.obj(data, "abstraction", ("job", "operators", "workers"))
        job = shape.obj(d["job"], "job", ("id", "name", "version", "status"))
        ops = shape.array(d["operators"], "operators")
        workers = shape.array(d["workers"], "workers")
        return cls(
            shape.string(job["id"], "job.id"),
            shape.string(job["name"], "job.name"),
            shape.integer(job["version"], "job.version", 1),
            shape.string(job["status"], "job.status"),
            tuple(Operator.from_dict(x, f"operators[{i}]") for i, x in enumerate(ops)),
            tuple(Worker.from_dict(x, f"workers[{i}]") for i, x in enumerate(workers)),
        )


def from_graph(
    job_id: str,
    graph: JobGraph,
    layout: Layout,
    workers: Iterable[Any],
    *,
    status: str = "running",
    backend: str = "local",
) -> Abstraction:
    """Version 1 of the abstraction of ``graph`` deployed as ``layout``.

    ``layout`` is the :class:`runtime.layout.Layout` the job was deployed with (task ->
    worker, key groups, weight). ``workers`` are :class:`Worker` objects or
    worker records with ``id, host, cpus, memory_mb`` (see :meth:`Worker.from_info`;
    ``backend`` fills a missing backend); all of them become the job's workers. Each task
    gets logic ``logic_ref(op.logic)`` version 1, its key groups or weight from ``layout``
    and its worker's resources. Raises :class:`UnknownTask` or :class:`UnknownWorker` when
    ``layout`` does not match.
    """
    infos = tuple(
        w if isinstance(w, Worker) else Worker.from_info(w, backend=backend) for w in workers
    )
    by_id = {w.id: w for w in infos}
    where: Mapping[str, str] = layout.placement
    operators = []
    for spec in graph.operators:
        ref = logic_ref(spec.logic)
        tasks = []
        for tid in spec.task_ids():
            if tid not in where:
                raise UnknownTask(f"layout has no worker for task {tid!r}")
            worker = by_id.get(where[tid])
            if worker is None:
                raise UnknownWorker(f"task {tid!r} is placed on unknown worker {where[tid]!r}")
            if spec.keyed:
                workload = Workload(key_groups=tuple(layout.assignment[tid]))
            elif tid in layout.partitions:
                workload = Workload(partitions=tuple(layout.partitions[tid]))
            else:
                workload = Workload(weight=layout.weights[tid])
            tasks.append(Task(tid, Logic(ref, 1), workload, worker.resources()))
        operators.append(
            Operator(
                spec.name,
                spec.kind,
                spec.max_parallelism if spec.keyed else None,
                tuple(Input(i.upstream, i.partitioning) for i in spec.inputs),
                tuple(tasks),
                spec.combinable,
                tuple(layout.splits.get(spec.name, {}).items()),
            )
        )
    return Abstraction(job_id, graph.name, 1, status, tuple(operators), infos)
