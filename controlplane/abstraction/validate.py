"""Validation and application of plans (docs/design.md, section 2): pure, whole-plan, all or
nothing.

:func:`apply_plan` takes an abstraction and a plan and returns version N+1, or raises a
:class:`PlanError` whose message names the culprit (and, for an operation at fault, starts
with ``operation <i> (...)``). The input abstraction is never modified, so a refused plan
changes nothing. Rules:

- An operator keeps at least one task and its task indices stay ``0..n-1``; new tasks are
  ``"<operator>-<index>"`` and start with no work and the operator's current logic
  (:meth:`Operator.current_logic`). Sources that read shares of their input by task
  index are never rescaled nor given work but may move between workers; partitioned
  sources are rescaled and given partitions like keyed operators key groups.
- Keyed operators: every key group ``0..max_parallelism-1`` has exactly one owner.
  Partitioned sources: every partition of the base version has exactly one owner, and
  no other is named. Others: weights >= 0 and, except for sources, not all zero.
- A forward edge links task i to task i: both operators keep the same task indices.
- A worker may host at most ``slots`` tasks of the job; only a worker that gains tasks is
  checked (a worker already over its slots is not a reason to refuse unrelated plans).
  Tasks go to workers whose status is in ``PLACEABLE_STATUSES`` or to ``"new"``;
  placeholders that end up hosting nothing are dropped from the result.
- ``assignLogic`` applies to map, flat_map, filter and keyed operators; the ref must
  resolve through ``resolve_logic`` to a callable, or to a
  :class:`~runtime.dataflow.LogicRef` (a ref a resolver accepts without importing it, as
  the control plane's does: :mod:`controlplane.code.registry`).
- ``splitKey`` applies to the partial side of a combinable aggregation (``combinable``:
  ``aggregate`` or ``window_aggregate``):
  each listed task holds the key's part in one key group it owns at that point of the
  plan (the key's own group for its owner, the task's lowest group for the others),
  the key's own group first; a split's groups are distinct and in range. Its logic is
  not swapped (resubmit to change the aggregate).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from runtime.dataflow import LogicRef, resolve_ref
from runtime.keygroups import key_group

from .errors import (
    BadLogic,
    InvalidPlan,
    KeyGroupConflict,
    NoChange,
    PartitionConflict,
    PlanError,
    StaleVersion,
    TaskStillOwnsWork,
    UnknownOperator,
    UnknownTask,
    UnknownWorker,
    WorkerOverCapacity,
)
from .model import Abstraction, Operator
from .ops import AssignLogic, AssignResource, AssignWorkload, Op, Plan, SplitKey
from .parts import (
    NEW_WORKER,
    PLACEABLE_STATUSES,
    PLACEHOLDER_STATUS,
    Logic,
    Task,
    Worker,
    Workload,
    current_logic,
    next_placeholder,
    task_index,
)

__all__ = ["Resolver", "apply_plan", "check_abstraction", "format_groups", "resolve_importable"]

Resolver = Callable[[str], Any]


def format_groups(groups: Iterable[int], limit: int = 8) -> str:
    """Key groups as ranges for messages: ``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    ranges: list[list[int]] = []
    for g in sorted(groups):
        if ranges and g == ranges[-1][1] + 1:
            ranges[-1][1] = g
        else:
            ranges.append([g, g])
    text = [str(a) if a == b else f"{a}-{b}" for a, b in ranges[:limit]]
    if len(ranges) > limit:
        text.append("...")
    return ", ".join(text)


def resolve_importable(ref: str) -> Callable[..., Any]:
    """The default ``resolve_logic``, for programs that run their own coordinator: import
    ``package.module:callable`` in this process, or find ``code:<id>:callable`` among the
    uploads installed here (:mod:`runtime.codeload`). The control plane uses the
    registry's instead, which imports nothing.

    Raises :class:`BadLogic` for a malformed ref, a module that fails to import, a missing
    attribute, a non-callable, or code that was never uploaded.
    """
    try:
        return resolve_ref(ref)
    except Exception as exc:  # an imported module may raise anything
        raise BadLogic(str(exc)) from exc


def apply_plan(
    abstraction: Abstraction, plan: Plan, *, resolve_logic: Resolver = resolve_importable
) -> Abstraction:
    """Validate ``plan`` as a whole against ``abstraction`` and return the next version.

    Steps: 1. the base version must be current (:class:`StaleVersion`); 2. the plan must
    have operations; 3. operations apply in order to a draft (an error is located at its
    operation); 4. the result is checked as a whole (module docstring); 5. a result equal
    to ``abstraction`` is refused (:class:`NoChange`). ``resolve_logic(ref)`` returns the
    callable a ref names (or a :class:`~runtime.dataflow.LogicRef` for it) or raises; its
    message is included in :class:`BadLogic`.
    """
    # Step 1.
    if plan.base_version != abstraction.version:
        raise StaleVersion(plan.base_version, abstraction.version)
    # Step 2.
    if not plan.ops:
        raise InvalidPlan("the plan has no operations")
    # Step 3.
    draft = _Draft(abstraction)
    for i, op in enumerate(plan.ops):
        try:
            _apply(draft, op, resolve_logic)
        except PlanError as exc:
            exc.at(i, op.describe())
            raise
    result = draft.result()
    # Step 4.
    _check(result, abstraction, plan.discovered)
    # Step 5.
    if result.replace(version=abstraction.version) == abstraction:
        raise NoChange(f"the plan changes nothing in version {abstraction.version}")
    return result


def check_abstraction(abstraction: Abstraction) -> None:
    """Check the invariants of a whole abstraction (e.g. one read from storage or built by
    :func:`from_graph`); raises the :class:`PlanError` subclass naming the first violation."""
    _check(abstraction, None)


class _Draft:
    """The mutable working copy a plan's operations are applied to."""

    def __init__(self, base: Abstraction) -> None:
        self.base = base
        self.tasks: dict[str, dict[str, Task]] = {
            op.name: {t.id: t for t in op.tasks} for op in base.operators
        }
        self.workers: dict[str, Worker] = {w.id: w for w in base.workers}
        self.splits: dict[str, dict[Any, tuple[int, ...]]] = {
            op.name: op.splits() for op in base.operators
        }

    def task(self, op: Operator, task_id: str) -> Task:
        task = self.tasks[op.name].get(task_id)
        if task is not None:
            return task
        owner = task_id.rpartition("-")[0] if isinstance(task_id, str) else ""
        if owner != op.name and owner in self.tasks and task_id in self.tasks[owner]:
            raise UnknownTask(f"task {task_id!r} belongs to operator {owner!r}, not {op.name!r}")
        known = ", ".join(self.tasks[op.name]) or "none"
        raise UnknownTask(f"operator {op.name!r} has no task {task_id!r} (tasks: {known})")

    def target(self, worker_id: str) -> Worker:
        """The worker a task is placed on; ``"new"`` adds a placeholder worker."""
        if worker_id == NEW_WORKER:
            wid = next_placeholder(self.workers)
            self.workers[wid] = Worker(wid, "", 1.0, 0, "", PLACEHOLDER_STATUS)
            return self.workers[wid]
        worker = self.workers.get(worker_id)
        if worker is None:
            known = ", ".join(self.workers) or "none"
            raise UnknownWorker(
                f"no worker {worker_id!r} (workers: {known}); use 'new' to ask for a fresh one"
            )
        if worker.status not in PLACEABLE_STATUSES:
            raise InvalidPlan(
                f"worker {worker_id!r} is {worker.status}: only alive workers (or 'new') take tasks"
            )
        return worker

    def result(self) -> Abstraction:
        used = {t.worker for tasks in self.tasks.values() for t in tasks.values()}
        before = {w.id for w in self.base.workers}
        workers = tuple(w for w in self.workers.values() if w.id in before or w.id in used)
        operators = tuple(
            replace(
                op,
                tasks=tuple(self.tasks[op.name].values()),
                split_keys=tuple(self.splits[op.name].items()),
            )
            for op in self.base.operators
        )
        return replace(
            self.base, version=self.base.version + 1, operators=operators, workers=workers
        )


def _apply(draft: _Draft, op: Op, resolve_logic: Resolver) -> None:
    operator = draft.base.operator(op.operator)
    if isinstance(op, AssignWorkload):
        _assign_workload(draft, operator, op)
    elif isinstance(op, AssignResource):
        _assign_resource(draft, operator, op)
    elif isinstance(op, SplitKey):
        _split_key(draft, operator, op)
    else:
        _assign_logic(draft, operator, op, resolve_logic)


def _no_source_rescale(op: Operator) -> InvalidPlan:
    return InvalidPlan(
        f"operator {op.name!r} is a source: live rescaling of sources is not supported (each "
        "source task reads a fixed partition of the input); its tasks can only move to "
        "other workers"
    )


def _assign_workload(draft: _Draft, operator: Operator, op: AssignWorkload) -> None:
    name, mp = operator.name, operator.max_parallelism
    if operator.partitioned or op.kind == "partitions":
        _assign_partitions(draft, operator, op)
        return
    if operator.kind == "source":
        raise InvalidPlan(
            f"operator {name!r} is a source: its tasks read fixed partitions of the input, "
            "so it has no workload to assign"
        )
    if operator.keyed and not op.keyed:
        raise InvalidPlan(
            f"operator {name!r} is keyed: assign it key groups ({{task: [groups]}}), not weights"
        )
    if not operator.keyed and op.keyed:
        raise InvalidPlan(
            f"operator {name!r} is not keyed ({operator.kind}): assign it weights "
            "({task: weight}), not key groups"
        )
    for task_id, value in op.workload.items():
        task = draft.task(operator, task_id)
        if isinstance(value, tuple):
            assert mp is not None
            outside = [g for g in value if not 0 <= g < mp]
            if outside:
                raise KeyGroupConflict(
                    f"key group {outside[0]} given to {task_id!r} is outside 0..{mp - 1} "
                    f"(operator {name!r} has {mp} key groups)"
                )
            workload = Workload(key_groups=value)
        else:
            workload = Workload(weight=value)
        draft.tasks[name][task_id] = replace(task, workload=workload)


def _assign_partitions(draft: _Draft, operator: Operator, op: AssignWorkload) -> None:
    name = operator.name
    if not operator.partitioned:
        raise InvalidPlan(
            f"operator {name!r} does not read partitions ({operator.kind}): assign it "
            + ("key groups ({task: [groups]})" if operator.keyed else "weights ({task: weight})")
        )
    if op.kind != "partitions":
        raise InvalidPlan(
            f"operator {name!r} is a partitioned source: assign it partitions "
            '({task: ["<partition>", ...]}), not key groups or weights'
        )
    for task_id, value in op.workload.items():
        task = draft.task(operator, task_id)
        draft.tasks[name][task_id] = replace(task, workload=Workload(partitions=value))


def _assign_resource(draft: _Draft, operator: Operator, op: AssignResource) -> None:
    name = operator.name
    tasks = draft.tasks[name]
    fixed_source = operator.kind == "source" and not operator.partitioned
    if op.worker is None:
        task = draft.task(operator, op.task)
        if fixed_source:
            raise _no_source_rescale(operator)
        if task.workload.keyed and task.workload.owns_work:
            raise TaskStillOwnsWork(
                f"task {task.id!r} still owns key group(s) {format_groups(task.workload.key_groups or ())}; "
                "assign them to other tasks earlier in the plan, then remove it"
            )
        if task.workload.partitioned and task.workload.owns_work:
            raise TaskStillOwnsWork(
                f"task {task.id!r} still reads partition(s) "
                f"{', '.join(task.workload.partitions or ())}; assign them to other tasks "
                "earlier in the plan, then remove it"
            )
        if task.workload.owns_work:
            raise TaskStillOwnsWork(
                f"task {task.id!r} still has weight {task.workload.weight:g}; set it to 0 with "
                "assignWorkload earlier in the plan, then remove it"
            )
        if len(tasks) == 1:
            raise InvalidPlan(
                f"task {task.id!r} is the last task of operator {name!r}; it cannot be removed"
            )
        del tasks[op.task]
        return
    if op.task not in tasks:
        if fixed_source:
            raise _no_source_rescale(operator)
        if task_index(op.task, name) is None:
            raise InvalidPlan(
                f"new task id {op.task!r} must be '{name}-<index>' (e.g. '{name}-{len(tasks)}')"
            )
    worker = draft.target(op.worker)
    if op.task in tasks:
        tasks[op.task] = replace(tasks[op.task], resources=worker.resources())
        return
    if operator.keyed:
        empty = Workload(key_groups=())
    elif operator.partitioned:
        empty = Workload(partitions=())
    else:
        empty = Workload(weight=0.0)
    tasks[op.task] = Task(op.task, current_logic(tasks.values()), empty, worker.resources())


def _split_key(draft: _Draft, operator: Operator, op: SplitKey) -> None:
    name, mp = operator.name, operator.max_parallelism
    if not operator.combinable:
        raise InvalidPlan(
            f"operator {name!r} is not a combinable aggregation: only the first operator of "
            "key_by(...).aggregate(...) or key_by(...).window_aggregate(...) can split a key "
            "(its merge adds the parts up)"
        )
    assert mp is not None
    splits = draft.splits[name]
    if not op.tasks:
        if splits.pop(op.key, None) is None:
            raise InvalidPlan(f"key {op.key!r} of operator {name!r} is not split")
        return
    home = key_group(op.key, mp)
    groups: list[int] = []
    for task_id in op.tasks:
        owned = draft.task(operator, task_id).workload.key_groups or ()
        if not owned:
            raise InvalidPlan(
                f"task {task_id!r} owns no key groups: a split key's part lives in one of "
                "its task's key groups (give it some first)"
            )
        groups.append(home if home in owned else min(owned))
    groups.sort(key=lambda g: g != home)  # the key's own group first, if split there
    splits[op.key] = tuple(groups)


def _assign_logic(
    draft: _Draft, operator: Operator, op: AssignLogic, resolve_logic: Resolver
) -> None:
    name = operator.name
    if operator.combinable:
        raise InvalidPlan(
            f"operator {name!r} is a combinable aggregation: its aggregate is part of the "
            "job's graph (with its merge); resubmit the job to change it"
        )
    if operator.kind in ("source", "sink"):
        raise InvalidPlan(
            f"operator {name!r} is a {operator.kind}: its logic is an object configured when the "
            "job is submitted; assignLogic swaps the callables of map, flat_map, filter and "
            "keyed operators"
        )
    tasks = draft.tasks[name]
    targets = list(tasks) if op.tasks == "all" else [draft.task(operator, t).id for t in op.tasks]
    try:
        fn = resolve_logic(op.ref)
    except Exception as exc:  # the resolver may import user code, which may raise anything
        raise BadLogic(f"logic {op.ref!r} for operator {name!r} does not resolve: {exc}") from exc
    if not (callable(fn) or isinstance(fn, LogicRef)):
        raise BadLogic(
            f"logic {op.ref!r} for operator {name!r} resolves to a {type(fn).__name__}, "
            "which is not callable"
        )
    version = 1 + max(t.logic.version for t in tasks.values())
    for t in targets:
        tasks[t] = replace(tasks[t], logic=Logic(op.ref, version))


def _check(
    result: Abstraction, base: Abstraction | None, discovered: Mapping[str, Any] | None = None
) -> None:
    for op in result.operators:
        _check_operator(result, op)
        if op.partitioned:
            known = None
            if base is not None:
                known = {
                    p for t in base.operator(op.name).tasks for p in t.workload.partitions or ()
                }
                known |= set((discovered or {}).get(op.name, ()))
            _check_partitions(op, known)
    for op in result.operators:
        for inp in op.inputs:
            up = result.operator(inp.upstream)
            indices = [t.index for t in op.tasks]
            if inp.partitioning == "forward" and [t.index for t in up.tasks] != indices:
                raise InvalidPlan(
                    f"forward edge {up.name!r} -> {op.name!r} links task i to task i, but "
                    f"{up.name!r} would have {up.parallelism} task(s) and {op.name!r} "
                    f"{op.parallelism}; scale both together (scale() scales forward-connected "
                    "operators as a group)"
                )
    before = Counter(t.worker for op in base.operators for t in op.tasks) if base else Counter()
    after = Counter(t.worker for op in result.operators for t in op.tasks)
    for worker in result.workers:
        n = after[worker.id]
        if n > worker.slots and n > before[worker.id]:
            raise WorkerOverCapacity(
                f"worker {worker.id!r} would host {n} tasks of this job but has {worker.slots} slots"
            )


def _check_operator(result: Abstraction, op: Operator) -> None:
    where = f"operator {op.name!r}"
    indices = [t.index for t in op.tasks]
    if not indices:
        raise InvalidPlan(f"{where} has no tasks; every operator keeps at least one")
    if indices != list(range(len(indices))):
        missing = sorted(set(range(max(indices) + 1)) - set(indices))
        raise InvalidPlan(
            f"{where} would have tasks {', '.join(op.task_ids)}: task indices must be 0..n-1 "
            f"(missing {', '.join(f'{op.name}-{i}' for i in missing)}); remove the highest "
            "indices instead, or add the missing tasks"
        )
    for inp in op.inputs:
        if inp.upstream not in {o.name for o in result.operators}:
            raise UnknownOperator(f"{where} reads from unknown operator {inp.upstream!r}")
    for t in op.tasks:
        result.worker(t.worker)
    if op.keyed:
        _check_key_groups(op)
        _check_splits(op)
    elif op.kind != "source" and not any(t.workload.weight for t in op.tasks):
        raise InvalidPlan(f"every task of {where} has weight 0: at least one must receive records")


def _check_partitions(op: Operator, known: set[str] | None) -> None:
    """Every partition of ``op`` read by one task; with ``known`` (the partitions of the
    version a plan starts from), exactly those."""
    owner: dict[str, str] = {}
    for t in op.tasks:
        for p in t.workload.partitions or ():
            if p in owner:
                raise PartitionConflict(
                    f"partition {p!r} of operator {op.name!r} is read by both {owner[p]!r} "
                    f"and {t.id!r}"
                )
            if known is not None and p not in known:
                raise PartitionConflict(
                    f"operator {op.name!r} has no partition {p!r} (it has "
                    f"{', '.join(sorted(known))}); a plan moves partitions, it does not make them"
                )
            owner[p] = t.id
    if known is not None and (missing := sorted(known - owner.keys())):
        raise PartitionConflict(
            f"partition(s) {', '.join(missing)} of operator {op.name!r} would be read by no task"
        )


def _check_key_groups(op: Operator) -> None:
    mp = op.max_parallelism
    assert mp is not None
    owner: dict[int, str] = {}
    twice: list[tuple[int, str, str]] = []
    for t in op.tasks:
        for g in t.workload.key_groups or ():
            if not 0 <= g < mp:
                raise KeyGroupConflict(
                    f"key group {g} of task {t.id!r} is outside 0..{mp - 1} "
                    f"(operator {op.name!r} has {mp} key groups)"
                )
            if g in owner:
                twice.append((g, owner[g], t.id))
            else:
                owner[g] = t.id
    if twice:
        g, a, b = twice[0]
        more = f" ({len(twice) - 1} more key group(s) are owned twice)" if len(twice) > 1 else ""
        raise KeyGroupConflict(
            f"key group {g} of operator {op.name!r} is owned by both {a!r} and {b!r}{more}"
        )
    missing = [g for g in range(mp) if g not in owner]
    if missing:
        raise KeyGroupConflict(
            f"key group(s) {format_groups(missing)} of operator {op.name!r} are owned by no task"
        )


def _check_splits(op: Operator) -> None:
    mp = op.max_parallelism
    assert mp is not None
    for key, groups in op.split_keys:
        where = f"split key {key!r} of operator {op.name!r}"
        if len(set(groups)) != len(groups) or len(groups) < 2:
            raise InvalidPlan(f"{where}: its parts need two or more distinct key groups")
        outside = [g for g in groups if not 0 <= g < mp]
        if outside:
            raise KeyGroupConflict(f"{where}: key group {outside[0]} is outside 0..{mp - 1}")
