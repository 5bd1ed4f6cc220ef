"""Plans on running jobs: validate against the abstraction (:func:`.validation.validate`,
the one place a plan is checked), turn the result into a layout (:mod:`.layouts`), reconfigure
live (:mod:`.reconfig`), in steps (:mod:`.fluid`) or by the stop-and-restart baseline
(:mod:`.restart`), then make the new abstraction version current; cancel a plan
(:func:`cancel`, the one way a plan is cancelled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.abstraction import (
    Plan,
)
from controlplane.statuses import ReconfigurationStatus

from .errors import ReconfigurationError
from .events import UPDATE_TIMEOUT_S
from .fluid import run_fluid
from .layouts import layout_of, refresh_workers, substitute_new_workers
from .reconfig import run_locked
from .restart import restart_locked
from .slot import Cancellation
from .validation import ValidatedPlan, backend_name, validate
from .workers import remap_workers

if TYPE_CHECKING:
    from .model import RunningJob
    from .ports import JobHost
    from .report import Listener, RunReport

__all__ = ["apply", "cancel"]


async def apply(
    host: JobHost,
    job: RunningJob,
    plan: Plan | ValidatedPlan,
    *,
    wait: bool = True,
    sync_timeout_s: float | None = None,
    restart: bool = False,
    new_workers: bool = False,
    on_change: Listener | None = None,
    cancellation: Cancellation | None = None,
) -> RunReport:
    """Carry out ``plan`` (validated now by :func:`validate` unless it was) live.

    Raises the abstraction's :class:`~controlplane.abstraction.PlanError` subclasses for a
    refused plan (nothing is changed), :class:`ReconfigurationBusy` when ``wait`` is false
    and another reconfiguration runs, :class:`ReconfigurationError` when the job cannot
    change now (or has changed since ``plan`` was validated). Returns the report; on
    ``completed`` the job's abstraction is the new version. A plan in ``fluid`` mode runs
    as a sequence of small steps, each its own version (:mod:`.fluid`). With ``restart``,
    the plan is carried out by the stop-and-restart baseline (:mod:`.restart`) instead,
    for comparison, on new worker processes with ``new_workers`` (the new version names
    them). ``on_change(report)`` follows the report from its creation through every
    status change (see :func:`.reconfig.run_locked`). ``cancellation``: the plan's token,
    which the caller may have made with the job's reservation (see :func:`cancel`); a
    plan cancelled before it starts ends ``cancelled``.
    """
    slot = job.slot
    slot.refuse_if_busy(wait)
    async with slot.hold():
        token = cancellation or Cancellation()
        raw = plan.plan if isinstance(plan, ValidatedPlan) else plan
        token.fluid = raw.mode == "fluid" and not restart
        token.restart = restart
        slot.current = token
        started: list[str] = []  # workers started for the plan
        try:
            validated = plan if isinstance(plan, ValidatedPlan) else validate(host, job, plan)
            if validated.job_id != job.id or validated.base.version != job.abstraction.version:
                raise ReconfigurationError(
                    f"the plan was validated against version {validated.base.version} of job "
                    f"{validated.job_id}; job {job.id} is at version {job.abstraction.version}"
                )
            return await _apply_locked(
                host, job, validated, token, sync_timeout_s, new_workers, on_change, started
            )
        finally:
            slot.current = None
            await _let_go(host, started, token.record)


async def _let_go(host: JobHost, started: list[str], report: RunReport | None) -> None:
    """Retire the workers started for a plan that no running job uses now (the plan ended
    before it placed tasks there): a plan that does not complete leaves no new worker."""
    used = {w for job in host.jobs.values() if not job.done for w in job.layout.workers_used()}
    outcome = (
        f"reconfiguration {report.id} {report.status}" if report is not None else "its plan ended"
    )
    for wid in started:
        if wid not in used:
            await host.retire_worker(wid, f"started for a plan, unused: {outcome}")


def cancel(job: RunningJob, reason: str = "cancelled on request") -> RunReport | None:
    """Cancel the plan under way on ``job``, or reserved for it: it stops at its next safe
    point and ends ``cancelled``, saying what stays applied. Returns its report (None if
    it has none yet: it has not started, or new workers are still starting for it).

    A run still preparing or syncing aborts (the job goes on as before it); a fluid plan
    starts no further step or stage (those made stay applied: every key group is owned
    once at each). A plan in pause mode whose update has started cannot be stopped
    (state is moving between workers), nor can the stop-and-restart baseline:
    :class:`ReconfigurationError` says so, as when nothing is under way.
    """
    token = job.slot.plan
    if token is None:
        raise ReconfigurationError(f"no reconfiguration of job {job.id} is under way")
    if token.restart:
        raise ReconfigurationError(
            "a stop-and-restart cannot be cancelled: the job is stopped until it is redeployed"
        )
    active = job.active
    if (
        not token.fluid
        and active is not None
        and active.report.status == ReconfigurationStatus.UPDATING
    ):
        raise ReconfigurationError(
            f"reconfiguration {active.report.id} of job {job.id} is updating: its state is "
            f"moving between workers and it cannot be stopped; it ends within "
            f"{UPDATE_TIMEOUT_S:.0f}s"
        )
    token.request(reason)
    if active is not None:
        active.cancel(reason)
    return token.record


async def _apply_locked(
    host: JobHost,
    job: RunningJob,
    validated: ValidatedPlan,
    token: Cancellation,
    sync_timeout_s: float | None,
    new_workers: bool,
    on_change: Listener | None,
    started: list[str],
) -> RunReport:
    plan, current = validated.plan, validated.base
    backend = backend_name(host)
    if token.fluid:
        return await run_fluid(
            host,
            job,
            validated,
            sync_timeout_s=sync_timeout_s,
            on_change=on_change,
            cancellation=token,
            started=started,
        )
    new = await substitute_new_workers(host, validated.result, started)
    layout = layout_of(new, job.graph, current, job.layout)
    if token.restart:
        report = await restart_locked(
            host, job, layout, on_change=on_change, new_workers=new_workers
        )
        report.plan = plan
        if report.worker_map:
            infos = {w.id: w for w in host.workers.values()}
            moved = remap_workers(
                new, {old: infos[w] for old, w in report.worker_map.items()}, backend
            )
            new = refresh_workers(moved, host.alive_workers(), backend)
    else:
        report = await run_locked(
            host,
            job,
            layout,
            plan=plan,
            sync_timeout_s=sync_timeout_s,
            on_change=on_change,
            cancellation=token,
            affected=validated.affected,
        )
    completed = report.status == ReconfigurationStatus.COMPLETED
    report.version = new.version if completed else current.version
    if on_change is not None:
        on_change(report)
    if completed:
        job.abstraction = new
        job.versions.append(new)
    return report
