"""Fluid mode on the coordinator: a plan carried out as a sequence of small live steps.

:func:`~controlplane.abstraction.fluid_steps` splits the plan (setup, then batches of at
most ``batch_size`` key-group moves, removals last; :func:`.validation.validate` does it once)
and each step makes its own version. A step runs the live protocol of :mod:`.reconfig`
(prepare, sync, update) in its fluid form: keyed tasks that only give or gain key groups
do not pause (records of a moving group wait for its state alone, see
:mod:`runtime.stages`); upstream tasks pause while their routing swaps. The steps that
follow it and only move key groups among the same tasks (the batches) join it as its
later *stages*: no prepare, sync or update of their own, only a barrier each, started at
the upstream tasks, which swap their routing as they emit it (Step 3 of
:mod:`.protocol`); nothing pauses. The steps share one report: phases' times add up,
``pause_ms`` keeps each task's longest pause, ``steps`` counts the steps (versions) made,
``runs`` the live protocol runs.

A run that does not complete (or cannot start: the job stopped, a worker was lost) ends
the plan there. Steps before it stay applied: the job runs on their version (valid, every
key group owned once), and the report's error says so. A first step that cannot start
raises, as a plan in pause mode does: nothing changed. A cancelled plan (see
:func:`.plans.cancel`) ends ``cancelled`` at the next step or stage boundary the same way:
no further step or stage starts, the ones made stay applied.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from controlplane.abstraction import Abstraction, AbstractionError, Plan, apply_plan
from controlplane.statuses import ReconfigurationStatus as Status
from runtime.layout import Layout, only_key_groups_move

from .errors import ReconfigurationError
from .layouts import layout_of, refresh_workers, substitute_new_workers
from .reconfig import run_locked
from .report import RunReport
from .slot import Cancellation

if TYPE_CHECKING:
    from .model import RunningJob
    from .ports import JobHost
    from .report import Listener
    from .validation import ValidatedPlan

__all__ = ["run_fluid"]

PHASES = ("prepare", "sync", "update")
# Steps that only move key groups join the run before them as stages (module docstring).
# False runs every step on its own, as before stages existed: kept so that
# bench/reconfig.py can compare the two in one run.
JOIN_STAGES = True


async def run_fluid(
    host: JobHost,
    job: RunningJob,
    validated: ValidatedPlan,
    *,
    sync_timeout_s: float | None,
    on_change: Listener | None,
    cancellation: Cancellation | None = None,
    started: list[str] | None = None,
) -> RunReport:
    """Carry out the validated plan step by step; the caller holds ``job.slot.lock``.
    Returns the shared report; ``version`` is the version the job is left at. Workers
    started for its steps are added to ``started``."""
    cancellation = cancellation or Cancellation(fluid=True)
    plan, steps = validated.plan, validated.steps
    outer = RunReport.new(job.id, validated.affected, plan)
    job.reconfigurations.append(outer)
    cancellation.record = outer
    outer.steps = outer.runs = 0
    outer.timings_ms = dict.fromkeys(PHASES, 0.0)
    announce = on_change or (lambda _report: None)
    announce(outer)
    t0 = time.perf_counter()

    done_before = 0  # steps made by the runs before the current one

    def follow(step: RunReport) -> None:
        changed = False
        if step.stages_made:  # a staged run's steps count as their stages are made
            changed = outer.steps != done_before + step.stages_made
            outer.steps = done_before + step.stages_made
        live = (Status.PREPARING, Status.SYNCING, Status.UPDATING)
        if step.status in live and outer.status != step.status:
            outer.status = step.status
            changed = True
        if changed:  # a phase entered, or a stage made
            announce(outer)

    backend = host.backend.name if host.backend is not None else "local"

    def end(status: Status, error: str | None = None) -> RunReport:
        outer.error = error
        outer.timings_ms = {k: round(v, 3) for k, v in outer.timings_ms.items()}
        outer.timings_ms["total"] = round((time.perf_counter() - t0) * 1000, 3)
        outer.version = job.abstraction.version
        outer.status = status
        announce(outer)
        outer.ended_at = time.time()
        announce(outer)
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
                Status.CANCELLED,
                f"{cancellation.reason}: step {n} of {len(steps)} did not start{applied}",
            )
        try:
            base = refresh_workers(job.abstraction, host.alive_workers(), backend)
            step_plan = Plan(base.version, steps[i])
            target = await substitute_new_workers(
                host, apply_plan(base, step_plan, resolve_logic=host.resolve_logic), started
            )
            targets = [target]
            layouts = [layout_of(target, job.graph, base, job.layout)]
            if JOIN_STAGES:
                _join_stages(host, job, steps[i + 1 :], targets, layouts)
            step = await run_locked(
                host,
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
                end(Status.FAILED, str(exc))
                raise
            return end(Status.FAILED, f"step {n} of {len(steps)} could not start: {exc}{applied}")
        # The steps this run made: all of them, or (cut short, or failed in its update) the
        # stages made before it ended; none if it ended before its update.
        completed = step.status == Status.COMPLETED
        made = len(targets) if completed and not step.cut_short else step.stages_made
        i += made
        done_before = i
        outer.steps = i
        outer.runs += 1
        _add_up(outer, step)
        if step.status == Status.CANCELLED:
            return end(
                Status.CANCELLED,
                f"{step.error}: step {n} of {len(steps)} stopped before its update{applied}",
            )
        if not completed:
            if step.stages_made:  # a staged run failed in its update: the job failed with it
                applied = f"; the job failed after {i} steps"
            error = f"step {n} of {len(steps)} {step.status}: {step.error}{applied}"
            return end(step.status if n == 1 else Status.FAILED, error)
        job.abstraction = targets[made - 1]
        job.versions.extend(targets[:made])
        if made < len(targets):  # its later stages were withdrawn: the plan ends here
            kept = f"steps 1 to {i} stay applied: the job runs on version {job.abstraction.version}"
            if cancellation.reason:
                did_not = f"step {i + 1} of {len(steps)} did not start"
                return end(Status.CANCELLED, f"{cancellation.reason}: {did_not}; {kept}")
            return end(Status.FAILED, f"step {i + 1} of {len(steps)} aborted: {step.error}; {kept}")
    return end(Status.COMPLETED)


def _add_up(outer: RunReport, step: RunReport) -> None:
    """Add a run's times, pauses and copies to the plan's report."""
    outer.stage_ms += step.stage_ms
    outer.affected |= step.affected
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


def _join_stages(
    host: JobHost,
    job: RunningJob,
    later: tuple,
    targets: list[Abstraction],
    layouts: list[Layout],
) -> None:
    """Extend ``targets`` / ``layouts`` (one step so far) with the steps of ``later`` that
    follow it and only move key groups: they run as later stages of the same live
    reconfiguration (Step 3 of :mod:`.protocol`), each still its own version."""
    for ops in later:
        try:
            plan = Plan(targets[-1].version, ops)
            target = apply_plan(targets[-1], plan, resolve_logic=host.resolve_logic)
        except AbstractionError:
            return  # it runs on its own and reports the error then
        layout = layout_of(target, job.graph, targets[-1], layouts[-1])
        if not only_key_groups_move(layouts[-1], layout):
            return
        targets.append(target)
        layouts.append(layout)
