"""From an abstraction version to the runtime's layout, and back.

This is where the pure abstraction (:mod:`controlplane.abstraction`) meets the runtime's
:class:`~runtime.layout.Layout`: a task's worker, key groups and weight map one to one;
a partitioned source task's partitions too;
its logic becomes a per-task override whenever it differs from the job graph's own: a
pickled :class:`~runtime.dataflow.LogicRef`, which the worker resolves (imports) as it
unpickles it, so the coordinator never imports the code a ref names. Used by plans
(:mod:`.plans`, :mod:`.fluid`) and by the coordinator for a job's first version.
"""

from __future__ import annotations

import pickle
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from controlplane.abstraction import Abstraction, Worker, from_graph
from controlplane.statuses import WorkerStatus
from runtime.dataflow import JobGraph, LogicRef, logic_ref
from runtime.layout import Layout

from .workers import remap_workers, start_workers

if TYPE_CHECKING:
    from .model import RunningJob
    from .ports import Membership

__all__ = ["abstraction_of", "layout_of", "refresh_workers", "substitute_new_workers"]


def abstraction_of(job: RunningJob, workers: list[Any], backend: str = "local") -> Abstraction:
    """Version 1 of a freshly deployed job's abstraction (``backend`` started its workers)."""
    return from_graph(job.id, job.graph, job.layout, workers, backend=backend)


def refresh_workers(a: Abstraction, workers: list[Any], backend: str) -> Abstraction:
    """The same version with the coordinator's current workers (new ones added, lost ones
    marked ``lost``): workers are resources the job may use, not its configuration."""
    known = {w.id: w for w in a.workers}
    fresh = {w.id: Worker.from_info(w, backend=backend) for w in workers}
    merged = [fresh.get(wid) or _lost(w) for wid, w in known.items()]
    merged += [w for wid, w in fresh.items() if wid not in known]
    return a.replace(workers=tuple(merged))


def _lost(w: Worker) -> Worker:
    return replace(w, status=WorkerStatus.LOST)


def layout_of(new: Abstraction, graph: JobGraph, old: Abstraction, current: Layout) -> Layout:
    """The layout that runs ``new``; logic overrides are kept, copied or built from refs
    (resolved by the workers, not here)."""
    placement: dict[str, str] = {}
    assignment: dict[str, tuple[int, ...]] = {}
    weights: dict[str, float] = {}
    partitions: dict[str, tuple[str, ...]] = {}
    logic: dict[str, bytes] = {}
    for op in new.operators:
        spec = graph.operator(op.name)
        base = logic_ref(spec.logic)
        donors = (
            {t.logic: t.id for t in old.operator(op.name).tasks} if _has_op(old, op.name) else {}
        )
        for t in op.tasks:
            placement[t.id] = t.resources.worker
            if spec.keyed:
                assignment[t.id] = tuple(t.workload.key_groups or ())
            elif t.workload.partitioned:
                partitions[t.id] = tuple(t.workload.partitions or ())
            else:
                weights[t.id] = float(t.workload.weight or 0.0)
            donor = donors.get(t.logic)
            if donor is not None:
                if donor in current.logic:
                    logic[t.id] = current.logic[donor]
            elif not (t.logic.version == 1 and t.logic.ref == base):
                logic[t.id] = pickle.dumps(LogicRef(t.logic.ref))
    splits = {op.name: op.splits() for op in new.operators if op.split_keys}
    return Layout(placement, assignment, weights, logic, partitions, splits)


def _has_op(a: Abstraction, name: str) -> bool:
    return any(op.name == name for op in a.operators)


async def substitute_new_workers(
    coordinator: Membership, a: Abstraction, started: list[str] | None = None
) -> Abstraction:
    """Start one worker per ``new-<k>`` placeholder and put its real id in its place (the
    ids started are added to ``started``)."""
    placeholders = a.workers_to_start()
    if not placeholders:
        return a
    fresh = await start_workers(coordinator, len(placeholders), "the plan asks for a new worker")
    if started is not None:
        started.extend(w.id for w in fresh)
    return remap_workers(a, dict(zip(placeholders, fresh, strict=True)), coordinator.backend.name)
