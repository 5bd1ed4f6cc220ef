"""What changes between two versions of a job's abstraction, and which tasks it touches.

:func:`diff` lists, per operator, the key groups that change owner, the weights that
change, the keys split or merged back (a combinable aggregation's), the tasks added,
removed or moved to another worker and the tasks whose logic changes, then computes the affected set of docs/design.md, section 3, step 1. Two tasks are
*connected* when a channel links them: over a forward edge task i of the upstream operator
and task i of the downstream one, over any other edge every pair. With *changed work* the
tasks gaining or losing key groups or weight (and every task of an operator whose split
keys change: their routing does) and *changed place* the tasks added, removed or moved:

- ``upstream_routing_changes``: tasks connected upstream of a task with changed work or
  changed place (their routing table or output channels change);
- ``downstream_channel_changes``: tasks connected downstream of a task with changed place
  (an input channel is added, removed or reconnected);
- ``affected``: tasks with changed work, changed place or changed logic, plus both sets.

The two sets only hold tasks present in both versions: new and removed tasks are affected
anyway and have no routing to change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import AbstractionError
from .model import Abstraction
from .parts import Logic, json_key

__all__ = ["Diff", "OperatorDiff", "diff"]


@dataclass(frozen=True)
class OperatorDiff:
    """The changes of one operator, each list sorted (by key group or task index).

    ``key_group_moves`` are ``(group, from task, to task)``; ``partition_moves`` (of a
    partitioned source) ``(partition, from task, to task)``; ``weight_changes`` are
    ``(task, old, new)`` with 0.0 for a task absent from one side; ``moved_tasks`` are
    ``(task, from worker, to worker)``; ``logic_changes`` are ``(task, old, new)`` for
    tasks present in both versions; ``split_changes`` are ``(key, old groups, new
    groups)`` (``()`` for a key not split on that side) and ``split_tasks`` the operator's
    tasks when there are any (their routing changes).
    """

    operator: str
    key_group_moves: tuple[tuple[int, str, str], ...] = ()
    weight_changes: tuple[tuple[str, float, float], ...] = ()
    new_tasks: tuple[str, ...] = ()
    removed_tasks: tuple[str, ...] = ()
    moved_tasks: tuple[tuple[str, str, str], ...] = ()
    logic_changes: tuple[tuple[str, Logic, Logic], ...] = ()
    partition_moves: tuple[tuple[str, str, str], ...] = ()
    split_changes: tuple[tuple[Any, tuple[int, ...], tuple[int, ...]], ...] = ()
    split_tasks: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (
            self.split_changes
            or self.key_group_moves
            or self.partition_moves
            or self.weight_changes
            or self.new_tasks
            or self.removed_tasks
            or self.moved_tasks
            or self.logic_changes
        )

    @property
    def work_changed(self) -> frozenset[str]:
        """Tasks gaining or losing key groups, partitions or weight."""
        moves = [*self.key_group_moves, *self.partition_moves]
        owners = {t for _, a, b in moves for t in (a, b)}
        return frozenset(owners | {t for t, _, _ in self.weight_changes} | set(self.split_tasks))

    @property
    def place_changed(self) -> frozenset[str]:
        """Tasks added, removed or moved to another worker."""
        return frozenset(
            (*self.new_tasks, *self.removed_tasks, *(t for t, _, _ in self.moved_tasks))
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "operator": self.operator,
            "key_group_moves": [list(m) for m in self.key_group_moves],
            "partition_moves": [list(m) for m in self.partition_moves],
            "weight_changes": [list(w) for w in self.weight_changes],
            "new_tasks": list(self.new_tasks),
            "removed_tasks": list(self.removed_tasks),
            "moved_tasks": [list(m) for m in self.moved_tasks],
            "logic_changes": [[t, a.to_dict(), b.to_dict()] for t, a, b in self.logic_changes],
            "split_changes": [
                {"key": json_key(k), "before": list(a), "after": list(b)}
                for k, a, b in self.split_changes
            ],
        }


@dataclass(frozen=True)
class Diff:
    """The changes from ``old_version`` to ``new_version`` of one job.

    ``operators`` holds the operators that change, in topological order; ``new_workers``
    and ``removed_workers`` are worker ids (placeholders ``"new-<k>"`` included).
    """

    job_id: str
    old_version: int
    new_version: int
    operators: tuple[OperatorDiff, ...]
    new_workers: tuple[str, ...]
    removed_workers: tuple[str, ...]
    affected: frozenset[str]
    upstream_routing_changes: frozenset[str]
    downstream_channel_changes: frozenset[str]

    def operator(self, name: str) -> OperatorDiff:
        """The changes of operator ``name`` (empty if it does not change)."""
        return next((d for d in self.operators if d.operator == name), OperatorDiff(name))

    @property
    def key_group_moves(self) -> dict[str, tuple[tuple[int, str, str], ...]]:
        return {d.operator: d.key_group_moves for d in self.operators if d.key_group_moves}

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "old_version": self.old_version,
            "new_version": self.new_version,
            "operators": [d.to_dict() for d in self.operators],
            "new_workers": list(self.new_workers),
            "removed_workers": list(self.removed_workers),
            "affected": sorted(self.affected),
            "upstream_routing_changes": sorted(self.upstream_routing_changes),
            "downstream_channel_changes": sorted(self.downstream_channel_changes),
        }


def diff(old: Abstraction, new: Abstraction) -> Diff:
    """The changes from ``old`` to ``new``: two versions of one job (same operators and
    edges), in either order. Raises :class:`AbstractionError` otherwise."""
    if old.job_id != new.job_id or [_shape(op) for op in old.operators] != [
        _shape(op) for op in new.operators
    ]:
        raise AbstractionError(
            f"cannot diff job {old.job_id!r} v{old.version} against job {new.job_id!r} "
            f"v{new.version}: not two versions of the same job graph"
        )
    ops = tuple(
        d for d in (_operator_diff(old, new, op.name) for op in old.operators) if not d.empty
    )
    both = {t for op in old.operators for t in op.task_ids} & {
        t for op in new.operators for t in op.task_ids
    }
    tasks = _TaskIndex(old, new)
    upstream: set[str] = set()
    downstream: set[str] = set()
    affected: set[str] = set()
    for d in ops:
        affected |= d.work_changed | d.place_changed | {t for t, _, _ in d.logic_changes}
        for task in d.work_changed | d.place_changed:
            for up, inp in new.upstream(d.operator):
                upstream.update(tasks.connected(up.name, task, inp.partitioning))
        for task in d.place_changed:
            for down, inp in new.downstream(d.operator):
                downstream.update(tasks.connected(down.name, task, inp.partitioning))
    upstream &= both
    downstream &= both
    old_workers = [w.id for w in old.workers]
    new_workers = [w.id for w in new.workers]
    return Diff(
        job_id=new.job_id,
        old_version=old.version,
        new_version=new.version,
        operators=ops,
        new_workers=tuple(w for w in new_workers if w not in old_workers),
        removed_workers=tuple(w for w in old_workers if w not in new_workers),
        affected=frozenset(affected | upstream | downstream),
        upstream_routing_changes=frozenset(upstream),
        downstream_channel_changes=frozenset(downstream),
    )


def _shape(op: Any) -> tuple[Any, ...]:
    return (op.name, op.kind, op.max_parallelism, op.inputs)


class _TaskIndex:
    """The tasks of each operator over both versions, for finding connected tasks."""

    def __init__(self, old: Abstraction, new: Abstraction) -> None:
        self.ids: dict[str, set[str]] = {op.name: set(op.task_ids) for op in old.operators}
        for op in new.operators:
            self.ids[op.name] |= set(op.task_ids)

    def connected(self, operator: str, task: str, partitioning: str) -> Iterable[str]:
        """The tasks of ``operator`` linked to ``task`` by an edge with ``partitioning``."""
        if partitioning != "forward":
            return self.ids[operator]
        twin = f"{operator}-{task.rpartition('-')[2]}"
        return [twin] if twin in self.ids[operator] else []


def _operator_diff(old: Abstraction, new: Abstraction, name: str) -> OperatorDiff:
    a, b = old.operator(name), new.operator(name)
    before = {t.id: t for t in a.tasks}
    after = {t.id: t for t in b.tasks}

    def order(task_id: str) -> int:
        return int(task_id.rpartition("-")[2])

    common = sorted(before.keys() & after.keys(), key=order)
    moves: tuple[tuple[int, str, str], ...] = ()
    partition_moves: tuple[tuple[str, str, str], ...] = ()
    weights: list[tuple[str, float, float]] = []
    if a.partitioned:
        reads_a = {p: t.id for t in a.tasks for p in t.workload.partitions or ()}
        reads_b = {p: t.id for t in b.tasks for p in t.workload.partitions or ()}
        partition_moves = tuple(
            (p, reads_a[p], reads_b[p])
            for p in sorted(reads_a.keys() & reads_b.keys())
            if reads_a[p] != reads_b[p]
        )
    elif a.keyed:
        owner_a, owner_b = old.owner_of(name), new.owner_of(name)
        moves = tuple(
            (g, owner_a[g], owner_b[g])
            for g in sorted(owner_a.keys() & owner_b.keys())
            if owner_a[g] != owner_b[g]
        )
    else:
        for t in sorted(before.keys() | after.keys(), key=order):
            wa = before[t].workload.weight if t in before else 0.0
            wb = after[t].workload.weight if t in after else 0.0
            if wa != wb:
                weights.append((t, wa or 0.0, wb or 0.0))
    splits_a, splits_b = a.splits(), b.splits()
    splits = tuple(
        (k, splits_a.get(k, ()), splits_b.get(k, ()))
        for k in sorted(splits_a.keys() | splits_b.keys(), key=repr)
        if splits_a.get(k) != splits_b.get(k)
    )
    return OperatorDiff(
        operator=name,
        split_changes=splits,
        split_tasks=tuple(sorted(after, key=order)) if splits else (),
        key_group_moves=moves,
        partition_moves=partition_moves,
        weight_changes=tuple(weights),
        new_tasks=tuple(sorted(after.keys() - before.keys(), key=order)),
        removed_tasks=tuple(sorted(before.keys() - after.keys(), key=order)),
        moved_tasks=tuple(
            (t, before[t].worker, after[t].worker)
            for t in common
            if before[t].worker != after[t].worker
        ),
        logic_changes=tuple(
            (t, before[t].logic, after[t].logic)
            for t in common
            if before[t].logic != after[t].logic
        ),
    )
