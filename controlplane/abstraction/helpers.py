"""Helpers that build plans: scale, rebalance, migrate, change of logic (pure).

Each takes the current abstraction and returns a :class:`Plan` against its version, or an
empty (falsy) plan when there is nothing to do; it raises the same :class:`PlanError`
subclasses as validation when asked for something impossible (an unknown operator, task
or worker, rescaling a source...). The plans still go through
:func:`~controlplane.abstraction.apply_plan` like any other.

Operations are ordered so that each plan validates: new tasks are placed before they get
work, and tasks give their work away before they are removed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from .balance import even_split, greedy_balance, imbalance, inverse_weights
from .errors import InvalidPlan, KeyGroupConflict, UnknownTask, WorkerOverCapacity
from .model import Abstraction, Operator
from .ops import AssignLogic, AssignResource, AssignWorkload, Op, Plan, SplitKey
from .parts import NEW_WORKER, PLACEABLE_STATUSES, next_placeholder

__all__ = ["add_partitions", "migrate", "rebalance", "scale", "split_key", "update_logic"]

Mode = Literal["pause", "fluid"]


def scale(
    abstraction: Abstraction,
    operator: str,
    n: int,
    *,
    workers: Sequence[str] | None = None,
    mode: Mode = "pause",
    batch_size: int | None = None,
) -> Plan:
    """A plan giving ``operator`` ``n`` tasks, moving as few key groups as possible.

    Operators linked to ``operator`` by forward edges (see
    :meth:`Abstraction.forward_group`) are scaled with it, since a forward edge needs equal
    task indices on both sides; task i of each of them goes to the same worker. Scaling
    out adds indices ``current..n-1``; scaling in removes the highest indices after moving
    their work. Keyed operators end with near-equal key-group counts
    (:func:`~controlplane.abstraction.balance.even_split`: new tasks take groups from the
    most loaded, removed tasks' groups go to the least loaded); the others end with equal
    weights 1.0.

    New tasks go to ``workers`` in turn when given (ids, or ``"new"`` for a fresh worker
    per index), else each index to the placeable worker hosting the fewest tasks that
    has room for the whole group (:class:`WorkerOverCapacity` if none has).

    Raises :class:`InvalidPlan` for ``n < 1``, more tasks than key groups, or a source in
    the group (sources are never rescaled live).
    """
    a = abstraction
    op = a.operator(operator)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InvalidPlan(f"cannot scale {operator!r} to {n!r} tasks: give an int >= 1")
    group = [a.operator(name) for name in a.forward_group(operator)]
    for member in group:
        if member.kind == "source" and member.name == operator:
            raise InvalidPlan(
                f"operator {operator!r} is a source: live rescaling of sources is not supported"
            )
        if member.kind == "source":
            raise InvalidPlan(
                f"operator {operator!r} is forward-connected to source {member.name!r}, which "
                f"cannot be rescaled live; rebalance the stream between them in the job to "
                f"scale {operator!r} alone"
            )
        if member.keyed and n > (member.max_parallelism or 0):
            raise InvalidPlan(
                f"operator {member.name!r} has {member.max_parallelism} key groups: it cannot "
                f"have {n} tasks"
            )
    current = op.parallelism
    if n == current:
        return Plan(a.version, (), mode, batch_size)
    creates: list[Op] = []
    if n > current:
        targets = _placements(a, range(current, n), [m.name for m in group], workers)
        for i, (first, rest) in zip(range(current, n), targets, strict=True):
            for k, member in enumerate(group):
                creates.append(
                    AssignResource(member.name, f"{member.name}-{i}", first if k == 0 else rest)
                )
    workloads: list[Op] = []
    removals: list[Op] = []
    for member in group:
        keep = [f"{member.name}-{i}" for i in range(n)]
        gone = [t for t in member.tasks if t.id not in keep]
        if member.keyed:
            before = {t.id: t.workload.key_groups or () for t in member.tasks}
            after = even_split(before, keep)
            changed: dict = {t: g for t, g in after.items() if before.get(t, ()) != g}
            changed.update({t.id: () for t in gone if t.workload.owns_work})
        else:
            weight = {t.id: t.workload.weight for t in member.tasks}
            changed = {t: 1.0 for t in keep if weight.get(t, 0.0) != 1.0}
            changed.update({t.id: 0.0 for t in gone if t.workload.owns_work})
        if changed:
            workloads.append(AssignWorkload(member.name, changed))
        removals.extend(AssignResource(member.name, t.id, None) for t in gone)
    return Plan(a.version, (*creates, *workloads, *removals), mode, batch_size)


def _placements(
    a: Abstraction, indices: range, group: list[str], workers: Sequence[str] | None
) -> list[tuple[str, str]]:
    """Per new index: the worker of the group's first operator and of the others (equal,
    except for ``"new"``: the first asks for the worker, the others name its placeholder)."""
    taken = {w.id for w in a.workers}
    result: list[tuple[str, str]] = []
    if workers is not None:
        if isinstance(workers, str) or not workers:
            raise InvalidPlan("workers must be a non-empty list of worker ids (or 'new')")
        for w in workers:
            if w != NEW_WORKER:
                a.worker(w)
        for k, _ in enumerate(indices):
            w = workers[k % len(workers)]
            if w == NEW_WORKER:
                placeholder = next_placeholder(taken)
                taken.add(placeholder)
                result.append((NEW_WORKER, placeholder))
            else:
                result.append((w, w))
        return result
    count = {w.id: len(a.tasks_on(w.id)) for w in a.workers if w.status in PLACEABLE_STATUSES}
    for i in indices:
        fits = [w for w in a.workers if w.id in count and count[w.id] + len(group) <= w.slots]
        if not fits:
            tasks = ", ".join(f"{name}-{i}" for name in group)
            raise WorkerOverCapacity(
                f"no worker has room for {tasks}; add workers or pass workers=['new'] to ask "
                "the backend for fresh ones"
            )
        best = min(fits, key=lambda w: count[w.id])
        count[best.id] += len(group)
        result.append((best.id, best.id))
    return result


def rebalance(
    abstraction: Abstraction,
    operator: str,
    loads: Mapping[int, float] | Mapping[str, float] | None = None,
    *,
    threshold: float = 0.0,
    mode: Mode = "pause",
    batch_size: int | None = None,
) -> Plan:
    """A plan evening out the work of ``operator``'s tasks (same tasks, same workers).

    Keyed operators: with ``loads`` (key group -> load, e.g. records per second; missing
    groups weigh 0) :func:`~controlplane.abstraction.balance.greedy_balance` lowers the
    highest task load with few moves; without, key groups are split evenly by count with
    the fewest moves. Other operators: ``loads`` maps task ids to their per-record cost
    (e.g. busy seconds per record, TAG-style) and weights become inversely proportional to
    it (:func:`~controlplane.abstraction.balance.inverse_weights`); without, weights become
    equal. Nothing changes (an empty plan) when the :func:`imbalance` of task loads (key
    group loads or counts summed per task; weight x cost for the others) is already at
    most ``threshold`` (e.g. 0.1: the busiest task is at most 10% above the mean).

    Raises :class:`InvalidPlan` for a source, an operator whose inputs are all forward or
    broadcast (weights route nothing there), negative or non-finite loads or threshold;
    :class:`KeyGroupConflict` for a key group out of range; :class:`UnknownTask` for a
    task of another operator.
    """
    a = abstraction
    op = a.operator(operator)
    if not _non_negative(threshold):
        raise InvalidPlan(f"threshold must be a finite number >= 0, got {threshold!r}")
    if op.kind == "source":
        raise InvalidPlan(
            f"operator {operator!r} is a source: its tasks read fixed partitions, there is nothing to rebalance"
        )
    for key, value in (loads or {}).items():
        if not _non_negative(value):
            raise InvalidPlan(f"load of {key!r} must be a finite number >= 0, got {value!r}")
    changed: dict
    if op.keyed:
        changed = _rebalance_keyed(op, loads, threshold)
    else:
        changed = _rebalance_weights(op, loads, threshold)
    ops = (AssignWorkload(op.name, changed),) if changed else ()
    return Plan(a.version, ops, mode, batch_size)


def _non_negative(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _rebalance_keyed(op: Operator, loads: Mapping | None, threshold: float) -> dict:
    current = {t.id: t.workload.key_groups or () for t in op.tasks}
    mp = op.max_parallelism or 0
    if loads is None:
        if imbalance(len(g) for g in current.values()) <= threshold:
            return {}
        after = even_split(current, list(current))
    else:
        for g in loads:
            if not isinstance(g, int) or isinstance(g, bool) or not 0 <= g < mp:
                raise KeyGroupConflict(
                    f"load given for key group {g!r}, outside 0..{mp - 1} of operator {op.name!r}"
                )
        after = greedy_balance(current, loads, threshold)
    return {t: g for t, g in after.items() if g != current[t]}


def _rebalance_weights(op: Operator, costs: Mapping | None, threshold: float) -> dict:
    if all(i.partitioning in ("forward", "broadcast") for i in op.inputs):
        raise InvalidPlan(
            f"operator {op.name!r} receives records only over forward or broadcast edges, where "
            "weights route nothing; rebalance its upstream operator instead"
        )
    tasks = list(op.task_ids)
    for t in costs or {}:
        if t not in tasks:
            raise UnknownTask(f"operator {op.name!r} has no task {t!r} (tasks: {', '.join(tasks)})")
    target = inverse_weights(tasks, costs or {})
    weight = {t.id: t.workload.weight or 0.0 for t in op.tasks}
    per_record = {t: 1.0 / target[t] for t in tasks}  # the costs inverse_weights assumed
    if imbalance(weight[t] * per_record[t] for t in tasks) <= threshold:
        return {}
    return {t: w for t, w in target.items() if not math.isclose(w, weight[t], rel_tol=1e-9)}


def migrate(
    abstraction: Abstraction,
    task: str,
    worker: str,
    *,
    with_forward: bool = False,
    mode: Mode = "pause",
    batch_size: int | None = None,
) -> Plan:
    """A plan moving ``task`` to ``worker`` (an id or ``"new"``); empty if it is already
    there. With ``with_forward``, the tasks of the same index in the operators linked to
    its operator by forward edges (:meth:`Abstraction.forward_group`, what Flink chains into
    one task) move with it, so the edges between them stay on one worker; those already
    there stay. Raises :class:`UnknownTask` or :class:`UnknownWorker`."""
    a = abstraction
    t = a.task(task)
    if worker != NEW_WORKER:
        a.worker(worker)
    moving = [t]
    if with_forward:
        moving += [
            a.task(f"{name}-{t.index}")
            for name in a.forward_group(t.operator)
            if name != t.operator
        ]
    moving = [m for m in moving if m.worker != worker]
    target = worker
    ops: list[Op] = []
    for m in moving:
        ops.append(AssignResource(m.operator, m.id, target))
        if target == NEW_WORKER:  # the partners follow to the worker the first one asks for
            target = next_placeholder({w.id for w in a.workers})
    return Plan(a.version, tuple(ops), mode, batch_size)


def update_logic(
    abstraction: Abstraction, operator: str, ref: str, tasks: Sequence[str] | None = None
) -> Plan:
    """A plan swapping the logic of ``tasks`` of ``operator`` (all of them when None) to
    ``ref``; the ref is resolved when the plan is applied. Raises :class:`UnknownOperator`
    or :class:`UnknownTask`."""
    op = abstraction.operator(operator)
    if tasks is not None:
        for t in tasks:
            if t not in op.task_ids:
                raise UnknownTask(
                    f"operator {operator!r} has no task {t!r} (tasks: {', '.join(op.task_ids)})"
                )
    return Plan(
        abstraction.version, (AssignLogic(operator, "all" if tasks is None else tuple(tasks), ref),)
    )


def split_key(
    abstraction: Abstraction, operator: str, key: Any, tasks: Sequence[str] | int
) -> Plan:
    """A plan splitting ``key`` of the combinable aggregation ``operator`` over ``tasks``
    (task ids; or a number of ways: the key's owner and the tasks after it, by index,
    round the operator), or with ``[]`` (or ``0`` or ``1`` ways) merging it back. Raises
    :class:`UnknownOperator`, :class:`UnknownTask` or :class:`InvalidPlan`."""
    op = abstraction.operator(operator)
    if isinstance(tasks, int):
        if tasks > op.parallelism:
            raise InvalidPlan(
                f"cannot split a key of {operator!r} {tasks} ways: it has {op.parallelism} tasks"
            )
        ids = op.task_ids
        owner = ids.index(op.owner_of_key(key)) if op.keyed else 0  # validation refuses others
        tasks = [ids[(owner + i) % len(ids)] for i in range(tasks)] if tasks > 1 else []
    for t in tasks:
        if t not in op.task_ids:
            raise UnknownTask(
                f"operator {operator!r} has no task {t!r} (tasks: {', '.join(op.task_ids)})"
            )
    return Plan(abstraction.version, (SplitKey(operator, key, tuple(tasks)),))


def add_partitions(abstraction: Abstraction, operator: str, found: Sequence[str]) -> Plan:
    """A plan giving the partitions ``found`` (by the partitioned source ``operator``
    since this version) to its tasks, each to the task reading the fewest (ties: the
    lowest index); empty if every one is read already. Raises :class:`UnknownOperator`,
    or :class:`InvalidPlan` if ``operator`` is not a partitioned source."""
    op = abstraction.operator(operator)
    if not op.partitioned:
        raise InvalidPlan(f"operator {operator!r} is not a partitioned source")
    reads = {t.id: list(t.workload.partitions or ()) for t in op.tasks}
    known = {p for ps in reads.values() for p in ps}
    new = [p for p in dict.fromkeys(found) if p not in known]
    if not new:
        return Plan(abstraction.version, ())
    for p in new:
        least = min(op.tasks, key=lambda t: (len(reads[t.id]), t.index))
        reads[least.id].append(p)
    before = {t.id: len(t.workload.partitions or ()) for t in op.tasks}
    changed = {t: ps for t, ps in reads.items() if len(ps) != before[t]}
    return Plan(
        abstraction.version,
        (AssignWorkload(operator, changed),),
        discovered={operator: tuple(new)},
    )
