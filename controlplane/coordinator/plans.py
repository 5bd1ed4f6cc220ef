"""Plans on running jobs: validate against the abstraction, turn the result into a layout
(:mod:`.layouts`), reconfigure live (:mod:`.reconfig`), in steps (:mod:`.fluid`) or by the
stop-and-restart baseline (:mod:`.restart`), then make the new abstraction version current.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from controlplane.abstraction import Plan, apply_plan

from .fluid import run_fluid
from .layouts import abstraction_of, layout_of, refresh_workers, substitute_new_workers
from .reconfig import (
    UPDATE_TIMEOUT_S,
    Cancellation,
    Reconfiguration,
    ReconfigurationError,
    refuse_if_busy,
    run_locked,
)
from .restart import restart_locked
from .workers import NEW_WORKER_TIMEOUT_S, remap_workers

if TYPE_CHECKING:
    from .model import Job
    from .ports import JobHost

__all__ = [
    "NEW_WORKER_TIMEOUT_S",
    "abstraction_of",
    "apply",
    "cancel",
    "layout_of",
    "refresh_workers",
    "substitute_new_workers",
]


async def apply(
    coordinator: JobHost,
    job: Job,
    plan: Plan,
    *,
    wait: bool = True,
    sync_timeout_s: float | None = None,
    restart: bool = False,
    new_workers: bool = False,
    on_change: Callable[[Reconfiguration], None] | None = None,
    cancellation: Cancellation | None = None,
) -> Reconfiguration:
    """Validate ``plan`` against the job's current abstraction and carry it out live.

    Raises the abstraction's :class:`~controlplane.abstraction.PlanError` subclasses for a
    refused plan (nothing is changed), :class:`ReconfigurationBusy` when ``wait`` is false
    and another reconfiguration runs, :class:`ReconfigurationError` when the job cannot
    change now. Returns the record; on ``completed`` the job's abstraction is the new
    version. A plan in ``fluid`` mode runs as a sequence of small steps, each its own
    version (:mod:`.fluid`). With ``restart``, the plan is carried out by the
    stop-and-restart baseline (:mod:`.restart`) instead, for comparison, on new worker
    processes with ``new_workers`` (the new version names them). ``on_change(record)`` follows the record
    from its creation through every status change (see :func:`.reconfig.run_locked`).
    ``cancellation``: a token the caller may cancel the plan with before it holds the
    job's lock (see :func:`cancel` for after); a plan cancelled so ends ``cancelled``.
    """
    refuse_if_busy(job, wait)
    async with job.lock:
        cancellation = cancellation or Cancellation()
        cancellation.fluid = plan.mode == "fluid" and not restart
        cancellation.restart = restart
        job.cancellation = cancellation
        started: list[str] = []  # workers started for the plan
        try:
            return await _apply_locked(
                coordinator,
                job,
                plan,
                cancellation,
                sync_timeout_s,
                new_workers,
                on_change,
                started,
            )
        finally:
            job.cancellation = None
            await _let_go(coordinator, started, cancellation.record)


async def _let_go(coordinator: JobHost, started: list[str], rec: Reconfiguration | None) -> None:
    """Retire the workers started for a plan that no running job uses now (the plan ended
    before it placed tasks there): a plan that does not complete leaves no new worker."""
    used = {
        w for job in coordinator.jobs.values() if not job.done for w in job.layout.workers_used()
    }
    outcome = f"reconfiguration {rec.id} {rec.status}" if rec is not None else "its plan ended"
    for wid in started:
        if wid not in used:
            await coordinator.retire_worker(wid, f"started for a plan, unused: {outcome}")


def cancel(job: Job, reason: str = "cancelled on request") -> Reconfiguration | None:
    """Cancel the plan under way on ``job``: it stops at its next safe point and ends
    ``cancelled``, saying what stays applied. Returns its record (None if it has none
    yet: new workers are still starting for it).

    A run still preparing or syncing aborts (the job goes on as before it); a fluid plan
    starts no further step or stage (those made stay applied: every key group is owned
    once at each). A plan in pause mode whose update has started cannot be stopped
    (state is moving between workers), nor can the stop-and-restart baseline:
    :class:`ReconfigurationError` says so, as when nothing is under way.
    """
    token = job.cancellation
    if token is None:
        raise ReconfigurationError(f"no reconfiguration of job {job.id} is under way")
    if token.restart:
        raise ReconfigurationError(
            "a stop-and-restart cannot be cancelled: the job is stopped until it is redeployed"
        )
    active = job.active
    if not token.fluid and active is not None and active.status == "updating":
        raise ReconfigurationError(
            f"reconfiguration {active.id} of job {job.id} is updating: its state is moving "
            f"between workers and it cannot be stopped; it ends within {UPDATE_TIMEOUT_S:.0f}s"
        )
    token.request(reason)
    if active is not None:
        active.on_cancel()
    return token.record


async def _apply_locked(
    coordinator: JobHost,
    job: Job,
    plan: Plan,
    cancellation: Cancellation,
    sync_timeout_s: float | None,
    new_workers: bool,
    on_change: Callable[[Reconfiguration], None] | None,
    started: list[str],
) -> Reconfiguration:
    restart = cancellation.restart
    backend = coordinator.backend.name if coordinator.backend is not None else "local"
    current = refresh_workers(job.abstraction, coordinator.alive_workers(), backend)
    new = apply_plan(current, plan, resolve_logic=coordinator.resolve_logic)
    if cancellation.fluid:
        return await run_fluid(
            coordinator,
            job,
            current,
            plan,
            sync_timeout_s=sync_timeout_s,
            on_change=on_change,
            cancellation=cancellation,
            started=started,
        )
    new = await substitute_new_workers(coordinator, new, started)
    layout = layout_of(new, job.graph, current, job.layout)
    if restart:
        rec = await restart_locked(
            coordinator, job, layout, on_change=on_change, new_workers=new_workers
        )
        rec.plan = plan
        if rec.worker_map:
            infos = {w.id: w for w in coordinator.workers.values()}
            moved = remap_workers(
                new, {old: infos[w] for old, w in rec.worker_map.items()}, backend
            )
            new = refresh_workers(moved, coordinator.alive_workers(), backend)
    else:
        rec = await run_locked(
            coordinator,
            job,
            layout,
            plan=plan,
            sync_timeout_s=sync_timeout_s,
            on_change=on_change,
            cancellation=cancellation,
        )
    rec.version = new.version if rec.status == "completed" else current.version
    if rec.status == "completed":
        job.abstraction = new
        job.versions.append(new)
    return rec
