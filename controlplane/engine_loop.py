"""The engine's side on the coordinator's event loop (see :mod:`controlplane.engine`).

Every function here runs on the loop, called by :class:`~controlplane.engine.Engine`
(request threads reach them only through its synchronous methods):

- :func:`check_plan`: the plan a builder makes from the job's current abstraction,
  validated by the coordinator, before it is reserved or previewed (step 1 of the
  engine's three); :func:`check_room`: the ``max_workers`` limit; :func:`preview_plan`:
  what a checked plan would do, neither reserved nor carried out.
- :func:`carry_out_plan`: step 3, the reserved plan run by ``coordinator.apply_plan``,
  with a :class:`~controlplane.engine_views.Progress` reported at every phase and a final
  one (its outcome), then :func:`free` gives the job back.
- :func:`job_state`, :func:`metrics_view`, :func:`registered_workers`: the frozen views
  (:mod:`controlplane.engine_views`) copied from the coordinator's jobs and workers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from controlplane.abstraction import AbstractionError, bytes_shipped, diff, step_bytes
from controlplane.coordinator import (
    Coordinator,
    CoordinatorError,
    ReconfigurationError,
    RunningJob,
    RunReport,
    ValidatedPlan,
)
from controlplane.engine_views import (
    JobState,
    JobView,
    MetricsView,
    PlanBuilder,
    Preview,
    Progress,
    Reservation,
    WorkerView,
)
from controlplane.errors import (
    Forbidden,
    JobNotRunning,
    PlanRefused,
    ReconfigurationInProgress,
    WorkerLimit,
    from_abstraction_error,
)
from controlplane.statuses import JobStatus, ReconfigurationStatus

__all__ = [
    "carry_out_plan",
    "check_plan",
    "check_room",
    "free",
    "job_state",
    "log_failure",
    "metrics_view",
    "preview_plan",
    "registered_workers",
]

logger = logging.getLogger(__name__)


def check_plan(
    coordinator: Coordinator,
    job_id: str,
    build: PlanBuilder,
    reserving: bool,
    may_start_workers: bool,
    max_workers: int,
) -> tuple[RunningJob, JobView, ValidatedPlan]:
    """On the loop: the job, the view ``build`` read and the plan it made, validated by
    the coordinator; raises what :meth:`.Engine.reserve` documents (busy only when
    ``reserving``: the job's slot says whether it is)."""
    job = coordinator.jobs.get(job_id)
    if job is None:
        raise JobNotRunning(
            "the job is not deployed on this control plane (it ended, or the control "
            "plane restarted since); submit it again"
        )
    if reserving and job.slot.busy:
        raise ReconfigurationInProgress(
            "another reconfiguration of this job is under way; wait until it ends, "
            "then build the plan on the version it leaves"
        )
    if job.status not in (JobStatus.RUNNING, JobStatus.RECONFIGURING) or job.abstraction is None:
        raise JobNotRunning(f"the job is {job.status}: only a running job can be reconfigured")
    view = JobView(job, coordinator.current_abstraction(job_id))
    try:
        plan = build(view)
        if not plan.ops:
            raise PlanRefused(
                f"the plan has no operations: version {view.abstraction.version} already "
                "is what was asked",
                code="no_change",
            )
        validated = coordinator.validate_plan(job_id, plan)
    except AbstractionError as exc:
        raise from_abstraction_error(exc) from None
    starting = len(validated.result.workers_to_start())
    if starting and not may_start_workers:
        raise Forbidden(
            f'the plan starts {starting} new worker(s) ("new"), which needs an admin token '
            "(or a server started with STREAMPILOT_OPERATE_STARTS_WORKERS=true); place "
            "the tasks on existing workers instead (GET /workers)"
        )
    check_room(coordinator, starting, max_workers)
    return job, view, validated


def check_room(coordinator: Coordinator, starting: int, max_workers: int) -> None:
    """:class:`WorkerLimit` if ``starting`` more workers would pass ``max_workers``."""
    alive = len(coordinator.alive_workers())
    if starting and alive + starting > max_workers:
        raise WorkerLimit(
            f"starting {starting} worker(s) would make {alive + starting}; this server runs "
            f"at most {max_workers} (STREAMPILOT_MAX_WORKERS) and {alive} are "
            "alive: drain idle ones (DELETE /workers/{id}) or raise the limit"
        )


def preview_plan(
    coordinator: Coordinator,
    job_id: str,
    build: PlanBuilder,
    state_window_s: float,
    may_start_workers: bool,
    max_workers: int,
) -> Preview:
    """On the loop: what :meth:`.Engine.preview` answers for the plan ``build`` makes,
    checked by :func:`check_plan` but not reserved: the diff, the versions and the state it
    would ship, estimated from the sizes measured over the last ``state_window_s``."""
    _, view, validated = check_plan(
        coordinator, job_id, build, False, may_start_workers, max_workers
    )
    current, plan, new = validated.base, validated.plan, validated.result
    sizes = view.group_sizes(state_window_s)
    try:
        per_step = step_bytes(current, plan, sizes, coordinator.resolve_logic)
    except AbstractionError as exc:
        raise from_abstraction_error(exc) from None
    shipped = bytes_shipped(current, new, sizes)
    step = None if None in per_step else max(per_step, default=0.0)  # type: ignore[type-var]
    return Preview(
        plan=plan,
        diff=diff(current, new).to_dict(),
        affected=tuple(sorted(validated.affected)),
        steps=len(per_step),
        state_bytes_shipped=None if shipped is None else round(shipped),
        largest_step_bytes=None if step is None else round(step),
    )


async def carry_out_plan(
    coordinator: Coordinator,
    reservation: Reservation,
    report: Callable[[Progress], Awaitable[None]],
) -> None:
    """Run the reserved plan; ``report`` is awaited, in order, for the report's creation,
    each phase it enters (pending, preparing, syncing, updating) and each stage a fluid
    plan makes, then once with the outcome (unless cancelled: then the run is cancelled
    too and whoever cancelled records the outcome). The job is freed after the final
    report."""
    job_id, token = reservation.job_id, reservation.cancellation
    changes: asyncio.Queue[Progress | None] = asyncio.Queue()
    last: list[Progress] = []

    def on_change(run_report: RunReport) -> None:
        # Called by the coordinator, on this loop, from inside its protocol: only queue.
        now = Progress.of(run_report)
        if now.done or (last and last[-1] == now):
            return  # the outcome is reported below, with the new version
        last.append(now)
        changes.put_nowait(now)

    async def write_changes() -> None:
        while (progress := await changes.get()) is not None:
            await report(progress)

    if token.reason:  # cancelled before it started: nothing changed
        try:
            error = f"{token.reason}; nothing changed"
            await report(Progress.bare(ReconfigurationStatus.CANCELLED, error))
        finally:
            free(coordinator, reservation)
        return
    writer = asyncio.create_task(write_changes(), name=f"report-{job_id}")
    try:
        job = coordinator.jobs[job_id]
        run = asyncio.create_task(
            coordinator.apply_plan(
                job_id, reservation.validated, on_change=on_change, cancellation=token
            )
        )
        try:
            await asyncio.wait({run})
        except asyncio.CancelledError:
            run.cancel()
            writer.cancel()
            raise
        changes.put_nowait(None)
        await writer
        await report(_outcome(job, run, reservation.plan.base_version))
    finally:
        writer.cancel()
        free(coordinator, reservation)


def free(coordinator: Coordinator, reservation: Reservation) -> None:
    """End ``reservation`` (on the loop): the job may take another plan."""
    job = coordinator.jobs.get(reservation.job_id)
    if job is not None:
        job.slot.release(reservation.cancellation)


def registered_workers(coordinator: Coordinator) -> list[WorkerView]:
    """Every worker that has registered (lost ones too), by id, with the tasks of live jobs
    it hosts."""
    hosted: dict[str, list[str]] = {}
    for job in list(coordinator.jobs.values()):
        if job.status.ended:
            continue
        for task, worker in job.layout.placement.items():
            hosted.setdefault(worker, []).append(f"{job.id}/{task}")
    return [
        WorkerView(
            id=w.id,
            host=w.host,
            pid=w.pid,
            cpus=w.cpus,
            memory_mb=w.memory_mb,
            status=w.status,
            cpu_percent=w.cpu_percent,
            rss_mb=w.rss_mb,
            tasks=tuple(sorted(hosted.get(w.id, ()))),
            error=w.error,
            executor_id=w.executor_id,
        )
        for w in sorted(coordinator.workers.values(), key=lambda w: w.id)
    ]


def log_failure(run: asyncio.Task[None]) -> None:
    if not run.cancelled() and run.exception() is not None:
        logger.error("carrying out a plan failed", exc_info=run.exception())


def metrics_view(job: RunningJob, now: float, window_s: float) -> MetricsView:
    m = job.metrics
    since = now - window_s
    return MetricsView(
        now=now,
        window_s=window_s,
        samples=tuple(s for s in m.samples if s[0] >= since),
        operator_of=dict(m.operator_of),
        kinds=dict(m.kinds),
        placement=dict(job.layout.placement),
        workers={w: dict(usage) for w, usage in m.workers.items()},
        worker_samples=tuple(s for s in m.worker_samples if s[0] >= since),
    )


def job_state(job: RunningJob) -> JobState:
    version = job.abstraction.version if job.abstraction is not None else None
    return JobState(job.id, job.status, job.error, version)


def _outcome(job: RunningJob, run: asyncio.Task[RunReport], base_version: int) -> Progress:
    failed = ReconfigurationStatus.FAILED
    try:
        run_report = run.result()
    except AbstractionError as exc:
        return Progress.bare(failed, f"the plan was refused when applied: {exc}")
    except (ReconfigurationError, CoordinatorError) as exc:
        return Progress.bare(failed, str(exc))
    except Exception as exc:
        logger.exception("reconfiguration of job %s raised", job.id)
        return Progress.bare(failed, f"internal error: {type(exc).__name__}: {exc}")
    progress = Progress.of(run_report)
    version = run_report.version
    made = tuple(a.to_dict() for a in job.versions if base_version < a.version <= (version or 0))
    if run_report.status != ReconfigurationStatus.COMPLETED and not made:
        return progress
    return replace(progress, version=version, abstractions=made)
