"""Fluid mode: a plan carried out as a sequence of small steps (pure).

In ``pause`` mode a plan is one reconfiguration: every affected task pauses until all of
its state has moved, so a plan moving many key groups (or much state) pauses their tasks
for as long as the whole transfer takes. In ``fluid`` mode (after Megaphone's batched
migration) the plan becomes a sequence of plans, each its own reconfiguration and its own
version, each moving at most ``batch_size`` key groups: a task pauses only while its few
key groups move, and between steps the job runs on a valid intermediate configuration.

:func:`fluid_steps` splits a plan; each step is validated when applied
(:func:`~controlplane.abstraction.apply_plan`), and applying them in order gives the
plan's result (with a version per step). Steps, in order:

1. Setup: every operation of the plan except keyed workloads and removals, in the plan's
   order (new tasks and workers, migrations, logic, weights). Omitted when there is none.
2. One step per batch of key-group moves: ``(operator, from task, to task, group)``
   sorted, so that a batch touches few tasks, and cut every ``batch_size`` moves (one
   batch when ``batch_size`` is None).
3. The removals (their tasks emptied by then) are part of the last step.
"""

from __future__ import annotations

from collections import defaultdict

from .errors import NoChange
from .model import Abstraction
from .ops import AssignResource, AssignWorkload, Op, Plan
from .validate import Resolver, apply_plan, resolve_importable

__all__ = ["fluid_steps"]


def _removal(op: Op) -> bool:
    return isinstance(op, AssignResource) and op.worker is None


def _deferred(base: Abstraction, op: Op) -> bool:
    """Whether ``op`` is left out of the setup step: a keyed workload (it becomes the
    batches) or a removal (it waits for the last step, so that a task gives its key groups
    away first and forward-connected operators keep equal task indices throughout)."""
    keyed = {o.name for o in base.operators if o.keyed}
    return _removal(op) or (isinstance(op, AssignWorkload) and op.operator in keyed)


def fluid_steps(
    base: Abstraction, plan: Plan, *, resolve_logic: Resolver = resolve_importable
) -> list[tuple[Op, ...]]:
    """The operations of each step of ``plan`` (module docstring). Raises the plan's
    :class:`PlanError` if the plan itself is refused. Step ``i`` applies to the version
    the steps before it leave."""
    result = apply_plan(base, plan, resolve_logic=resolve_logic)
    setup = tuple(op for op in plan.ops if not _deferred(base, op))
    removals = tuple(op for op in plan.ops if _removal(op))
    steps: list[tuple[Op, ...]] = []
    current = base
    if setup:
        try:
            current = apply_plan(base, Plan(base.version, setup), resolve_logic=resolve_logic)
            steps.append(setup)
        except NoChange:
            pass
    moves = sorted(
        (op.name, src, result.owner_of(op.name)[g], g)
        for op in current.operators
        if op.keyed
        for g, src in current.owner_of(op.name).items()
        if result.owner_of(op.name)[g] != src
    )
    size = plan.batch_size or len(moves) or 1
    batches = [moves[i : i + size] for i in range(0, len(moves), size)]
    owned = {
        op.name: {t.id: set(t.workload.key_groups or ()) for t in op.tasks}
        for op in current.operators
        if op.keyed
    }
    for i, batch in enumerate(batches):
        touched: dict[str, set[str]] = defaultdict(set)
        for name, src, dst, group in batch:
            owned[name][src].discard(group)
            owned[name][dst].add(group)
            touched[name] |= {src, dst}
        ops: list[Op] = [
            AssignWorkload(name, {t: tuple(sorted(owned[name][t])) for t in sorted(tasks)})
            for name, tasks in sorted(touched.items())
        ]
        if i == len(batches) - 1:
            ops.extend(removals)
        steps.append(tuple(ops))
    if not batches and removals:  # removals of tasks that own nothing
        steps.append(removals)
    return steps
