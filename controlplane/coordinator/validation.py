"""A plan checked once: :func:`validate` is the one place a plan on a running job is
checked against its abstraction, and :class:`ValidatedPlan` what the engine, the plans
and fluid mode (:mod:`.plans`, :mod:`.fluid`) trust from then on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from controlplane.abstraction import (
    Abstraction,
    AbstractionError,
    Plan,
    apply_plan,
    fluid_steps,
)

from .events import union_affected
from .layouts import layout_of, refresh_workers

if TYPE_CHECKING:
    from .model import RunningJob
    from .ports import JobHost

__all__ = ["ValidatedPlan", "backend_name", "validate"]


@dataclass(frozen=True)
class ValidatedPlan:
    """A plan checked against a job's current version; made by :func:`validate` only, and
    trusted by :func:`apply` (which checks nothing again but that the job is still at
    that version). ``base``: that version with the coordinator's workers of the time;
    ``result``: the version the plan makes (``new-<k>`` placeholders for workers to
    start); ``affected``: the tasks the change touches, from its layouts
    (:func:`.events.union_affected`, over each fluid step in fluid mode): what its report
    says from the start; ``steps`` (fluid mode): the operations of each step, in order."""

    job_id: str
    plan: Plan
    base: Abstraction
    result: Abstraction
    affected: frozenset[str]
    steps: tuple[tuple, ...] = ()


def validate(host: JobHost, job: RunningJob, plan: Plan) -> ValidatedPlan:
    """Check ``plan`` against ``job``'s current abstraction (with the coordinator's current
    workers). Raises the abstraction's :class:`~controlplane.abstraction.PlanError`
    subclasses for a refused plan."""
    base = refresh_workers(job.abstraction, host.alive_workers(), backend_name(host))
    result = apply_plan(base, plan, resolve_logic=host.resolve_logic)
    path = [job.layout]
    steps: tuple[tuple, ...] = ()
    if plan.mode == "fluid":  # the union of the steps' changes
        steps = tuple(
            tuple(ops) for ops in fluid_steps(base, plan, resolve_logic=host.resolve_logic)
        )
        before = base
        for ops in steps:
            try:
                after = apply_plan(
                    before, Plan(before.version, ops), resolve_logic=host.resolve_logic
                )
            except AbstractionError:  # refused when it runs, with what came before kept
                break
            path.append(layout_of(after, job.graph, before, path[-1]))
            before = after
    else:
        path.append(layout_of(result, job.graph, base, job.layout))
    affected = union_affected(job.graph, path)
    return ValidatedPlan(job.id, plan, base, result, affected, steps)


def backend_name(host: JobHost) -> str:
    """The name of what starts the coordinator's workers."""
    return host.backend.name if host.backend is not None else "local"
