"""Initial placement of a job's tasks on workers (pure).

Task ``i`` of every operator goes to worker ``i mod n``, so forward chains (source-0 ->
split-0 -> count-0 -> sink-0) stay on one worker and talk in-process; key groups are split
into contiguous, near-equal ranges; rebalance weights start equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.dataflow import JobGraph
from runtime.keygroups import contiguous_split

__all__ = ["Placement", "initial_placement"]


@dataclass(frozen=True)
class Placement:
    tasks: dict[str, str]  # task id -> worker id
    assignment: dict[str, list[list[int]]]  # keyed operator -> key groups per task index
    weights: dict[str, list[float]]  # non-keyed operator -> weight per task index

    def workers_used(self) -> list[str]:
        return sorted(set(self.tasks.values()))


def initial_placement(graph: JobGraph, workers: Sequence[str]) -> Placement:
    """Spread ``graph`` over ``workers`` (in the order given). Raises if there are none."""
    if not workers:
        raise ValueError("no workers to place the job on")
    tasks: dict[str, str] = {}
    assignment: dict[str, list[list[int]]] = {}
    weights: dict[str, list[float]] = {}
    for op in graph.operators:
        for i, tid in enumerate(op.task_ids()):
            tasks[tid] = workers[i % len(workers)]
        if op.keyed:
            assignment[op.name] = contiguous_split(op.max_parallelism, op.parallelism)
        else:
            weights[op.name] = [1.0] * op.parallelism
    return Placement(tasks, assignment, weights)
