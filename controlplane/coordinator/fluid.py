"""Fluid mode on the coordinator: a plan carried out as a sequence of small live steps.

:func:`~controlplane.abstraction.fluid_steps` splits the plan (setup, then batches of at
most ``batch_size`` key-group moves, removals last) and each step makes its own
version. A step runs the live protocol of :mod:`.reconfig` (prepare, sync, update) in
its fluid form: keyed tasks that only give or gain key groups do not pause (records of a
moving group wait for its state alone, see :mod:`runtime.deployment`); upstream tasks
pause while their routing swaps. The steps that follow it and only move key groups
among the same tasks (the batches) join it as its later *stages*: no prepare, sync or
update of their own, only a barrier each, started at the upstream tasks, which swap
their routing as they emit it (:func:`.reconfig._drive_stages`); nothing pauses. The
steps share one record: phases' times add up, ``pause_ms`` keeps each task's longest
pause, ``steps`` counts the steps (versions) made, ``runs`` the live protocol runs.

A run that does not complete (or cannot start: the job stopped, a worker was lost) ends
the plan there. Steps before it stay applied: the job runs on their version (valid, every
key group owned once), and the record's error says so. A first step that cannot start
raises, as a plan in pause mode does: nothing changed. A cancelled plan (see
:func:`.plans.cancel`) ends ``cancelled`` at the next step or stage boundary the same way:
no further step or stage starts, the ones made stay applied.
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
from runtime.layout import Layout, only_key_groups_move

from .layouts import layout_of, refresh_workers, substitute_new_workers
from .reconfig import (
    Cancellation,
    Reconfiguration,
    ReconfigurationError,
    new_record,
    run_locked,
)

if TYPE_CHECKING:
    from .model import Job
    from .ports import JobHost

__all__ = ["run_fluid"]

PHASES = ("prepare", "sync", "update")
# Steps that only move key groups join the run before them as stages (module docstring).
# False runs every step on its own, as before stages existed: kept so that
# bench/reconfig.py can compare the two in one run.
JOIN_STAGES = True


async def run_fluid(
    coordinator: JobHost,
    job: Job,
    current: Abstraction,
    plan: Plan,
    *,
    sync_timeout_s: float | None,
    on_change: Callable[[Reconfiguration], None] | None,
    cancellation: Cancellation | None = None,
    started: list[str] | None = None,
) -> Reconfiguration:
    """Carry out ``plan`` (validated against ``current``, the job's version) step by step;
    the caller holds ``job.lock``. Returns the shared record; ``version`` is the version
    the job is left at. Workers started for its steps are added to ``started``."""
    cancellation = cancellation or Cancellation(fluid=True)
    steps = fluid_steps(current, plan, resolve_logic=coordinator.resolve_logic)
    outer = new_record(job, job.layout, plan)
    outer.cancellation = cancellation
    cancellation.record = outer
    outer.steps = outer.runs = 0
    outer.timings_ms = dict.fromkeys(PHASES, 0.0)
    if on_change is not None:
        outer.listener = on_change
        on_change(outer)
    started = time.perf_counter()

    done_before = 0  # steps made by the runs before the current one

    def follow(step: Reconfiguration) -> None:
        if step.status in ("preparing", "syncing", "updating") and outer.status != step.status:
            outer.status = step.status
        if step.stages_made:  # a staged run's steps count as their stages are made
            outer.steps = done_before + step.stages_made

    backend = coordinator.backend.name if coordinator.backend is not None else "local"

    def end(status: str, error: str | None = None) -> Reconfiguration:
        outer.error = error
        outer.timings_ms = {k: round(v, 3) for k, v in outer.timings_ms.items()}
        outer.timings_ms["total"] = round((time.perf_counter() - started) * 1000, 3)
        outer.version = job.abstraction.version
        outer.status = status
        outer.ended_at = time.time()
        return outer

    i = 0
    while i < len(steps):
        n = i + 1  # the step (1-based) this run starts with
        applied = (
            f"; steps 1 to {n - 1} stay applied: the job runs on version {job.abstraction.version}"
            if n > 1
            else "; nothing changed"
        )
        if cancellation.reason:
            return end(
                "cancelled",
                f"{cancellation.reason}: step {n} of {len(steps)} did not start{applied}",
            )
        try:
            base = refresh_workers(job.abstraction, coordinator.alive_workers(), backend)
            step_plan = Plan(base.version, steps[i])
            target = await substitute_new_workers(
                coordinator,
                apply_plan(base, step_plan, resolve_logic=coordinator.resolve_logic),
                started,
            )
            targets = [target]
            layouts = [layout_of(target, job.graph, base, job.layout)]
            if JOIN_STAGES:
                _join_stages(coordinator, job, steps[i + 1 :], targets, layouts)
            step = await run_locked(
                coordinator,
                job,
                layouts[-1],
                plan=plan,
                sync_timeout_s=sync_timeout_s,
                on_change=follow,
                record=False,
                fluid=True,
                stages=layouts,
                cancellation=cancellation,
            )
        except (ReconfigurationError, AbstractionError) as exc:
            if n == 1:  # nothing changed: refused like a plan in pause mode
                end("failed", str(exc))
                raise
            return end("failed", f"step {n} of {len(steps)} could not start: {exc}{applied}")
        # The steps this run made: all of them, or (cut short, or failed in its update) the
        # stages made before it ended; none if it ended before its update.
        made = (
            len(targets) if step.status == "completed" and not step.cut_short else step.stages_made
        )
        i += made
        done_before = i
        outer.steps = i
        outer.runs += 1
        outer.stage_ms += step.stage_ms
        outer.affected |= step.affected
        outer.new = layouts[made - 1] if step.status == "completed" else outer.new
        for phase in PHASES:
            outer.timings_ms[phase] += step.timings_ms.get(phase, 0.0)
        if "precopy" in step.timings_ms:  # part of its prepare
            outer.timings_ms["precopy"] = (
                outer.timings_ms.get("precopy", 0.0) + step.timings_ms["precopy"]
            )
        for wid, copied in step.precopied.items():
            mine = outer.precopied.setdefault(wid, dict.fromkeys(copied, 0.0))
            for k, v in copied.items():
                mine[k] = mine.get(k, 0.0) + v
        for task, ms in step.pause_ms.items():
            outer.pause_ms[task] = max(ms, outer.pause_ms.get(task, 0.0))
        for task, ms in step.update_ms.items():
            outer.update_ms[task] = max(ms, outer.update_ms.get(task, 0.0))
        if step.status == "cancelled":
            return end(
                "cancelled",
                f"{step.error}: step {n} of {len(steps)} stopped before its update{applied}",
            )
        if step.status != "completed":
            if step.stages_made:  # a staged run failed in its update: the job failed with it
                applied = f"; the job failed after {i} steps"
            error = f"step {n} of {len(steps)} {step.status}: {step.error}{applied}"
            return end(step.status if n == 1 else "failed", error)
        job.abstraction = targets[made - 1]
        job.versions.extend(targets[:made])
        if made < len(targets):  # its later stages were withdrawn: the plan ends here
            kept = f"steps 1 to {i} stay applied: the job runs on version {job.abstraction.version}"
            if cancellation.reason:
                did_not = f"step {i + 1} of {len(steps)} did not start"
                return end("cancelled", f"{cancellation.reason}: {did_not}; {kept}")
            return end("failed", f"step {i + 1} of {len(steps)} aborted: {step.error}; {kept}")
    return end("completed")


def _join_stages(
    coordinator: JobHost,
    job: Job,
    later: list,
    targets: list[Abstraction],
    layouts: list[Layout],
) -> None:
    """Extend ``targets`` / ``layouts`` (one step so far) with the steps of ``later`` that
    follow it and only move key groups: they run as later stages of the same live
    reconfiguration (:func:`.reconfig._drive_stages`), each still its own version."""
    for ops in later:
        try:
            plan = Plan(targets[-1].version, ops)
            target = apply_plan(targets[-1], plan, resolve_logic=coordinator.resolve_logic)
        except AbstractionError:
            return  # it runs on its own and reports the error then
        layout = layout_of(target, job.graph, targets[-1], layouts[-1])
        if not only_key_groups_move(layouts[-1], layout):
            return
        targets.append(target)
        layouts.append(layout)
