"""Fluid mode on the coordinator: a plan carried out as a sequence of small live steps.

:func:`~controlplane.abstraction.fluid_steps` splits the plan (setup, then batches of at
most ``batch_size`` key-group moves, removals last); each step runs the whole live
protocol of :mod:`.reconfig` (prepare, sync, update) in its fluid form and commits its
own version: keyed tasks that only give or gain key groups do not pause (records of a
moving group wait for its state alone, see :mod:`runtime.deployment`); upstream tasks
pause while their routing swaps. The steps share one record: phases' times add up,
``pause_ms`` keeps each task's longest pause, ``steps`` counts the steps run.

A step that does not complete (or cannot start: the job stopped, a worker was lost) ends
the plan there. Steps before it stay applied: the job runs on their version (valid, every
key group owned once), and the record's error says so. A first step that cannot start
raises, as a plan in pause mode does: nothing changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from controlplane.abstraction import (
    Abstraction,
    AbstractionError,
    Plan,
    apply_plan,
    fluid_steps,
)

from .reconfig import Reconfiguration, ReconfigurationError, new_record, run_locked

if TYPE_CHECKING:
    from .core import Coordinator
    from .model import Job

__all__ = ["run_fluid"]

PHASES = ("prepare", "sync", "update")


async def run_fluid(
    coordinator: Coordinator,
    job: Job,
    current: Abstraction,
    plan: Plan,
    *,
    sync_timeout_s: float | None,
    on_change: Callable[[Reconfiguration], None] | None,
) -> Reconfiguration:
    """Carry out ``plan`` (validated against ``current``, the job's version) step by step;
    the caller holds ``job.lock``. Returns the shared record; ``version`` is the version
    the job is left at."""
    from .plans import layout_of, refresh_workers, substitute_new_workers

    steps = fluid_steps(current, plan)
    outer = new_record(job, job.layout, plan)
    outer.steps = 0
    outer.timings_ms = dict.fromkeys(PHASES, 0.0)
    if on_change is not None:
        outer.listener = on_change
        on_change(outer)
    started = time.perf_counter()

    def follow(step: Reconfiguration) -> None:
        if step.status in ("preparing", "syncing", "updating") and outer.status != step.status:
            outer.status = step.status

    backend = coordinator.backend.name if coordinator.backend is not None else "local"

    def end(status: str, error: str | None = None) -> Reconfiguration:
        outer.error = error
        outer.timings_ms = {k: round(v, 3) for k, v in outer.timings_ms.items()}
        outer.timings_ms["total"] = round((time.perf_counter() - started) * 1000, 3)
        outer.version = job.abstraction.version
        outer.status = status
        outer.ended_at = time.time()
        return outer

    for i, ops in enumerate(steps, start=1):
        applied = (
            f"; steps 1 to {i - 1} stay applied: the job runs on version {job.abstraction.version}"
            if i > 1
            else ""
        )
        try:
            base = refresh_workers(job.abstraction, coordinator.alive_workers(), backend)
            target = await substitute_new_workers(
                coordinator, apply_plan(base, Plan(base.version, ops))
            )
            layout = layout_of(target, job.graph, base, job.layout)
            step = await run_locked(
                coordinator,
                job,
                layout,
                plan=plan,
                sync_timeout_s=sync_timeout_s,
                on_change=follow,
                record=False,
                fluid=True,
            )
        except (ReconfigurationError, AbstractionError) as exc:
            if i == 1:  # nothing changed: refused like a plan in pause mode
                end("failed", str(exc))
                raise
            return end("failed", f"step {i} of {len(steps)} could not start: {exc}{applied}")
        outer.steps = i
        outer.affected |= step.affected
        outer.new = layout if step.status == "completed" else outer.new
        for phase in PHASES:
            outer.timings_ms[phase] += step.timings_ms.get(phase, 0.0)
        for task, ms in step.pause_ms.items():
            outer.pause_ms[task] = max(ms, outer.pause_ms.get(task, 0.0))
        for task, ms in step.update_ms.items():
            outer.update_ms[task] = max(ms, outer.update_ms.get(task, 0.0))
        if step.status != "completed":
            error = f"step {i} of {len(steps)} {step.status}: {step.error}{applied}"
            return end(step.status if i == 1 else "failed", error)
        job.abstraction = target
        job.versions.append(target)
    return end("completed")
