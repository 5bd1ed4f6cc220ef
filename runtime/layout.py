"""The physical layout of a deployed job: where each task runs and what work it owns.

A :class:`Layout` is what the coordinator sends a worker (on deploy, and whole again with
every reconfiguration, so each worker can work out its own part by comparing old and
new): task -> worker, keyed task -> key groups, partitioned source task -> partitions,
other task -> weight, per-task logic overrides (pickled) for tasks whose logic was
swapped, and the split keys of combinable aggregations (operator -> key -> the key groups
its records are spread over, :mod:`runtime.aggregate`). The tasks of an operator are the
layout's task ids ``"<operator>-<index>"``, ordered by index; a forward edge links the
tasks with equal indices.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .dataflow import InputSpec, JobGraph, OperatorSpec
from .keygroups import contiguous_split

__all__ = [
    "Layout",
    "affected_tasks",
    "in_place_owners",
    "moved_key_groups",
    "split_task_id",
    "stages_can_overlap",
    "sync_only_tasks",
]


def split_task_id(task_id: str) -> tuple[str, int]:
    """``"count-3"`` -> ``("count", 3)``; ValueError for anything else."""
    name, sep, index = task_id.rpartition("-")
    if not sep or not name or not index.isdigit():
        raise ValueError(f"task id {task_id!r} is not '<operator>-<index>'")
    return name, int(index)


@dataclass(frozen=True)
class Layout:
    placement: Mapping[str, str]  # task -> worker
    assignment: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # keyed task -> groups
    weights: Mapping[str, float] = field(default_factory=dict)  # other task -> weight
    logic: Mapping[str, bytes] = field(default_factory=dict)  # task -> pickled logic override
    # partitioned source task -> the partitions it reads
    partitions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # combinable operator -> split key -> its parts' key groups (the home group first)
    splits: Mapping[str, Mapping[Any, tuple[int, ...]]] = field(default_factory=dict)

    @classmethod
    def initial(cls, graph: JobGraph, workers: list[str]) -> Layout:
        """Task ``i`` of every operator on worker ``i mod n``; even key-group ranges;
        partition ``j`` of a partitioned source read by its task ``j mod parallelism``."""
        if not workers:
            raise ValueError("no workers to place the job on")
        placement: dict[str, str] = {}
        assignment: dict[str, tuple[int, ...]] = {}
        weights: dict[str, float] = {}
        partitions: dict[str, tuple[str, ...]] = {}
        for op in graph.operators:
            split = contiguous_split(op.max_parallelism, op.parallelism) if op.keyed else None
            for i, tid in enumerate(op.task_ids()):
                placement[tid] = workers[i % len(workers)]
                if split is not None:
                    assignment[tid] = tuple(split[i])
                elif op.partitions is not None:
                    partitions[tid] = op.partitions[i :: op.parallelism]
                else:
                    weights[tid] = 1.0
        return cls(placement, assignment, weights, partitions=partitions)

    # -- queries -----------------------------------------------------------------------------

    def tasks_of(self, operator: str) -> list[str]:
        """The operator's task ids, ordered by index."""
        found = [
            (split_task_id(t)[1], t) for t in self.placement if split_task_id(t)[0] == operator
        ]
        return [t for _, t in sorted(found)]

    def workers_used(self) -> list[str]:
        return sorted(set(self.placement.values()))

    def upstream_tasks(self, graph: JobGraph, task: str, inp: InputSpec) -> list[str]:
        """The tasks of ``inp.upstream`` that send to ``task`` over that input."""
        ups = self.tasks_of(inp.upstream)
        if inp.partitioning == "forward":
            index = split_task_id(task)[1]
            return [u for u in ups if split_task_id(u)[1] == index]
        return ups

    def downstream_tasks(self, task: str, down: str, inp: InputSpec) -> list[str]:
        """The tasks of operator ``down`` that ``task`` sends to over ``inp``."""
        downs = self.tasks_of(down)
        if inp.partitioning == "forward":
            index = split_task_id(task)[1]
            return [d for d in downs if split_task_id(d)[1] == index]
        return downs

    def owner_table(self, op: OperatorSpec, targets: list[str]) -> list[int]:
        """Key group -> index in ``targets`` of its owner; ValueError naming a bad group."""
        position = {t: i for i, t in enumerate(targets)}
        owner = [-1] * op.max_parallelism
        for t in targets:
            for g in self.assignment.get(t, ()):
                if owner[g] != -1:
                    raise ValueError(f"key group {g} of {op.name!r} is owned twice")
                owner[g] = position[t]
        missing = [g for g, o in enumerate(owner) if o == -1]
        if missing:
            raise ValueError(f"key groups {missing[:10]} of {op.name!r} have no owner")
        return owner

    def logic_of(self, op: OperatorSpec, task: str) -> Any:
        data = self.logic.get(task)
        return op.logic if data is None else pickle.loads(data)

    def channels(self, graph: JobGraph) -> set[tuple[str, str]]:
        """Every (upstream task, downstream task) pair connected by a channel."""
        pairs = set()
        for op in graph.operators:
            for t in self.tasks_of(op.name):
                for inp in op.inputs:
                    pairs.update((u, t) for u in self.upstream_tasks(graph, t, inp))
        return pairs

    # -- wire format -----------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        return {
            "placement": dict(self.placement),
            "assignment": {t: list(g) for t, g in self.assignment.items()},
            "weights": dict(self.weights),
            "logic": dict(self.logic),
            "partitions": {t: list(p) for t, p in self.partitions.items()},
            "splits": {
                op: [[key, list(gs)] for key, gs in keys.items()]
                for op, keys in self.splits.items()
            },
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Layout:
        return cls(
            placement=dict(data["placement"]),
            assignment={t: tuple(g) for t, g in dict(data.get("assignment", {})).items()},
            weights={t: float(w) for t, w in dict(data.get("weights", {})).items()},
            logic=dict(data.get("logic", {})),
            partitions={t: tuple(p) for t, p in dict(data.get("partitions", {})).items()},
            splits={
                op: {_tuples(key): tuple(gs) for key, gs in keys}
                for op, keys in dict(data.get("splits", {})).items()
            },
        )

    def replace(self, **changes: Any) -> Layout:
        fields = {
            "placement": self.placement,
            "assignment": self.assignment,
            "weights": self.weights,
            "logic": self.logic,
            "partitions": self.partitions,
            "splits": self.splits,
        }
        fields.update(changes)
        return Layout(**fields)


def _tuples(key: Any) -> Any:
    """A key read from the wire: lists (tuples on the way out) back to tuples."""
    return tuple(_tuples(k) for k in key) if isinstance(key, list) else key


def moved_key_groups(old: Layout, new: Layout, tasks: Iterable[str]) -> list[tuple[int, str, str]]:
    """(group, from task, to task) for groups whose owner changes among ``tasks``."""
    tasks = set(tasks)
    before = {g: t for t, gs in old.assignment.items() if t in tasks for g in gs}
    after = {g: t for t, gs in new.assignment.items() if t in tasks for g in gs}
    return sorted(
        (g, before[g], after[g]) for g in before.keys() & after.keys() if before[g] != after[g]
    )


def affected_tasks(graph: JobGraph, old: Layout, new: Layout) -> set[str]:
    """The tasks a change from ``old`` to ``new`` touches (docs/design.md, section 3, step 1).

    New and removed tasks; tasks whose worker, key groups, partitions, weight or logic
    change; the
    direct upstream tasks of tasks that are new, removed, moved or whose work changes
    (their routing changes); the direct downstream tasks whose set of upstream tasks
    changes (a channel is added or removed), or one of whose upstream tasks moves: its
    channel is reused by the task's new instance, and the downstream task must have taken
    in all the old instance sent before the barrier before the new one sends (those only
    sync, see :func:`sync_only_tasks`).
    """
    return _changed(graph, old, new) | _downstream_of_moved(graph, old, new)


def sync_only_tasks(graph: JobGraph, old: Layout, new: Layout) -> set[str]:
    """Affected tasks that change nothing themselves (downstream of a task that moves):
    they ack the barrier once aligned and never pause."""
    return _downstream_of_moved(graph, old, new) - _changed(graph, old, new)


def _downstream_of_moved(graph: JobGraph, old: Layout, new: Layout) -> set[str]:
    """Tasks in both layouts that keep a channel from a task that moves."""
    moved = {
        t
        for t in old.placement.keys() & new.placement.keys()
        if old.placement[t] != new.placement[t]
    }
    return {
        d
        for u, d in old.channels(graph) & new.channels(graph)
        if u in moved and d in old.placement and d in new.placement
    }


def _changed(graph: JobGraph, old: Layout, new: Layout) -> set[str]:
    """The affected tasks that change: their own work, place, logic, routing or inputs."""
    rerouted = _rerouted(old, new)
    affected = set(rerouted)
    affected.update(
        t
        for t in old.placement.keys() & new.placement.keys()
        if old.logic.get(t) != new.logic.get(t) or old.partitions.get(t) != new.partitions.get(t)
    )
    old_pairs, new_pairs = old.channels(graph), new.channels(graph)
    for u, d in old_pairs | new_pairs:
        if d in rerouted and u in old.placement and u in new.placement:
            affected.add(u)
    ups_old: dict[str, set[str]] = {}
    ups_new: dict[str, set[str]] = {}
    for u, d in old_pairs:
        ups_old.setdefault(d, set()).add(u)
    for u, d in new_pairs:
        ups_new.setdefault(d, set()).add(u)
    for d in old.placement.keys() & new.placement.keys():
        if ups_old.get(d, set()) != ups_new.get(d, set()):
            affected.add(d)
    return affected


def _rerouted(old: Layout, new: Layout) -> set[str]:
    """Tasks whose upstream routing must change: new, removed or moved, or whose key groups
    or weight change, or of an operator whose split keys change."""
    resplit = {
        op
        for op in old.splits.keys() | new.splits.keys()
        if old.splits.get(op) != new.splits.get(op)
    }
    rerouted: set[str] = {t for t in old.placement.keys() | new.placement.keys()
                          if split_task_id(t)[0] in resplit}  # fmt: skip
    for t in old.placement.keys() | new.placement.keys():
        if (
            t not in old.placement
            or t not in new.placement
            or old.placement[t] != new.placement[t]
            or old.assignment.get(t) != new.assignment.get(t)
            or old.weights.get(t) != new.weights.get(t)
        ):
            rerouted.add(t)
    return rerouted


def in_place_owners(graph: JobGraph, old: Layout, new: Layout) -> set[str]:
    """Keyed tasks whose only change is which key groups they own (fluid mode).

    Such a task stays on its worker with its logic, its inputs and its outputs: in fluid
    mode it never pauses. The key groups it gives away are final once it has aligned the
    barrier (later records of them go to their new owner), and records of the key groups
    it gains wait, per group, until that group's state has arrived.
    """
    rerouted = _rerouted(old, new)
    old_pairs, new_pairs = old.channels(graph), new.channels(graph)

    def ups(pairs: set[tuple[str, str]], t: str) -> set[str]:
        return {u for u, d in pairs if d == t}

    owners = set()
    for t in old.assignment.keys() & new.assignment.keys():
        if (
            old.assignment[t] == new.assignment[t]
            or old.placement.get(t) != new.placement.get(t)
            or old.logic.get(t) != new.logic.get(t)
            or ups(old_pairs, t) != ups(new_pairs, t)
            or any(d in rerouted for u, d in old_pairs | new_pairs if u == t)
        ):
            continue
        owners.add(t)
    return owners


def stage_entry(graph: JobGraph, prev: Layout, nxt: Layout) -> list[str] | None:
    """Where the barrier of a fluid stage (``prev`` -> ``nxt``, same tasks, only key groups
    move) can start instead of at the sources: the tasks that route to a task whose key
    groups change, except those downstream of another such task (they swap when they
    align it). None when a task downstream of them also reads from a task that is not
    (its alignment would wait forever): the barrier then starts at the sources.

    Started there, the barrier is a cut of the routers' output streams: every record a
    router sent before it used the old owners, every record after it the new ones, and
    every task downstream aligns it as it would a barrier from the sources.
    """
    changed = {t for t in prev.assignment if prev.assignment.get(t) != nxt.assignment.get(t)}
    pairs = prev.channels(graph)
    down: dict[str, set[str]] = {}
    up: dict[str, set[str]] = {}
    for u, d in pairs:
        down.setdefault(u, set()).add(d)
        up.setdefault(d, set()).add(u)
    routers = {u for u, d in pairs if d in changed}
    reach: set[str] = set()
    stack = list(routers)
    while stack:
        for d in down.get(stack.pop(), ()):
            if d not in reach:
                reach.add(d)
                stack.append(d)
    entry = routers - reach
    if all(up.get(d, set()) <= reach | entry for d in reach):
        return sorted(entry)
    return None


def only_key_groups_move(old: Layout, new: Layout) -> bool:
    """Whether ``new`` differs from ``old`` in key-group ownership alone (same tasks,
    workers, weights and logic): a change a fluid stage can make without pausing anyone."""
    return (
        old.placement == new.placement
        and old.weights == new.weights
        and old.partitions == new.partitions
        and old.logic == new.logic
        and old.splits == new.splits
        and old.assignment.keys() == new.assignment.keys()
    )


def _moving(prev: Layout, nxt: Layout) -> set[tuple[str, int]]:
    """(operator, key group) for each key group whose owner changes from ``prev`` to
    ``nxt`` (a key group is only ever owned by tasks of one operator)."""
    return {
        (split_task_id(t)[0], g)
        for t in prev.assignment.keys() | nxt.assignment.keys()
        for g in set(prev.assignment.get(t, ())) ^ set(nxt.assignment.get(t, ()))
    }


def stages_can_overlap(
    graph: JobGraph, first: tuple[Layout, Layout], then: tuple[Layout, Layout]
) -> bool:
    """Whether a fluid stage ``then`` (its layouts before and after) may start while stage
    ``first`` is under way: its barrier starts at the same tasks (so it follows the first
    one's through every channel and each task does its parts in order) and it moves none
    of the same key groups (none is shipped on before it has arrived)."""
    return stage_entry(graph, *first) == stage_entry(graph, *then) and not (
        _moving(*first) & _moving(*then)
    )
