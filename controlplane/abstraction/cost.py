"""What a change costs in keyed state shipped between workers (pure).

Keyed tasks report an estimate of their state's size (what moving all of it would
ship); :func:`key_group_bytes` spreads each task's size evenly over the key groups it
owns, :func:`bytes_shipped` adds up the key groups whose owner ends on another worker,
and :func:`largest_step` does so for each step a plan is carried out in (one, or its
fluid steps), since a step's state is what its tasks wait for.
"""

from __future__ import annotations

from collections.abc import Mapping

from .fluid import fluid_steps
from .model import Abstraction
from .ops import Plan
from .validate import Resolver, apply_plan, resolve_importable

__all__ = ["GroupBytes", "bytes_shipped", "key_group_bytes", "largest_step", "step_bytes"]

GroupBytes = Mapping[str, Mapping[int, float]]  # operator -> key group -> estimated bytes


def key_group_bytes(
    a: Abstraction,
    task_bytes: Mapping[str, float],
    shares: Mapping[str, Mapping[int, float]] | None = None,
) -> dict[str, dict[int, float]]:
    """Each key group's estimated state: the share its task reported for it (``shares``:
    task id -> key group -> bytes), else the task's size (``task_bytes``: task id ->
    bytes) over the task's key groups. Groups of tasks without a size are left out."""
    sizes: dict[str, dict[int, float]] = {}
    for op in a.operators:
        if not op.keyed:
            continue
        groups = sizes.setdefault(op.name, {})
        for t in op.tasks:
            owned = t.workload.key_groups or ()
            if t.id not in task_bytes or not owned:
                continue
            reported = (shares or {}).get(t.id, {})
            mean = task_bytes[t.id] / len(owned)
            groups.update({g: float(reported.get(g, mean)) for g in owned})
    return sizes


def bytes_shipped(before: Abstraction, after: Abstraction, sizes: GroupBytes) -> float | None:
    """Estimated bytes of keyed state that going from ``before`` to ``after`` ships between
    workers: the key groups whose owner ends on another worker. None when one of them has
    no size in ``sizes``."""
    total = 0.0
    for op in before.operators:
        if not op.keyed:
            continue
        was = {g: t.worker for t in op.tasks for g in t.workload.key_groups or ()}
        now = {
            g: t.worker for t in after.operator(op.name).tasks for g in t.workload.key_groups or ()
        }
        known = sizes.get(op.name, {})
        for g, worker in was.items():
            if now.get(g, worker) == worker:
                continue
            if g not in known:
                return None
            total += known[g]
    return total


def step_bytes(
    a: Abstraction, plan: Plan, sizes: GroupBytes, resolve_logic: Resolver = resolve_importable
) -> list[float | None]:
    """The state each step of ``plan`` ships (pause mode: one step, the whole plan; fluid:
    each of :func:`~controlplane.abstraction.fluid_steps`), None for a step moving a key
    group without a size. Raises the plan's :class:`PlanError` if it is refused."""
    if plan.mode != "fluid":
        return [bytes_shipped(a, apply_plan(a, plan, resolve_logic=resolve_logic), sizes)]
    shipped: list[float | None] = []
    for ops in fluid_steps(a, plan, resolve_logic=resolve_logic):
        after = apply_plan(a, Plan(a.version, ops), resolve_logic=resolve_logic)
        shipped.append(bytes_shipped(a, after, sizes))
        a = after
    return shipped


def largest_step(
    a: Abstraction, plan: Plan, sizes: GroupBytes, resolve_logic: Resolver = resolve_importable
) -> float | None:
    """The most state one step of ``plan`` ships (:func:`step_bytes`); None when a moving
    key group has no size."""
    shipped = step_bytes(a, plan, sizes, resolve_logic)
    return None if None in shipped else max(shipped, default=0.0)  # type: ignore[type-var]
