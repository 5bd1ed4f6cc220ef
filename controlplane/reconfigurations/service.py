"""Reconfigurations: turn a request (a raw plan or a helper) into a validated plan, record
it, and have it carried out once the record is committed; list and read the records.

A request is validated synchronously, in this order, and refused with nothing changed:
unknown job (NotFound), job not running (JobNotRunning), another reconfiguration under
way (ReconfigurationInProgress), then the plan against the current abstraction
(StaleBaseVersion, PlanRefused naming the culprit). Accepted, it is recorded ``pending``
and handed to the tracker after the unit of work commits; the tracker then records its
progress (:func:`record_progress`). Functions take the session as a keyword argument and
never commit.

Whether another reconfiguration is under way is the engine's to say (the job's
:class:`~controlplane.coordinator.slot.ChangeSlot`, reserved from acceptance until the
outcome is recorded): while the server runs it is the one source; the table is read
only to name the reconfiguration under way in the refusal. Across a restart the table
cannot hold a stale ``pending`` or running row that would block a job: the tracker marks
every unfinished one failed at start-up (:func:`fail_unfinished`), and the jobs
themselves do not survive a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane import db
from controlplane.abstraction import (
    AbstractionError,
    AssignResource,
    AssignWorkload,
    Plan,
    imbalance,
    migrate,
    rebalance,
    scale,
    update_logic,
)
from controlplane.engine import Engine, JobView, PlanBuilder, Progress, Reservation, job_key
from controlplane.errors import (
    JobNotRunning,
    NotCancellable,
    NotFound,
    PlanRefused,
    ReconfigurationInProgress,
    from_abstraction_error,
)
from controlplane.events import service as events
from controlplane.jobs import service as jobs
from controlplane.jobs.models import TERMINAL_JOB_STATUSES
from controlplane.pagination import fetch_page
from controlplane.statuses import ReconfigurationStatus
from controlplane.versions import service as versions

from .models import TERMINAL_RECONFIGURATION_STATUSES, ReconfigurationRecord
from .schemas import PreviewRead

__all__ = [
    "STATE_WINDOW_S",
    "Launch",
    "batch_for_bytes",
    "cancel_reconfiguration",
    "fail_unfinished",
    "get_reconfiguration",
    "list_reconfigurations",
    "logic_plan",
    "migrate_plan",
    "paced",
    "parse_plan",
    "preview_reconfiguration",
    "rebalance_plan",
    "record_progress",
    "record_recovery",
    "request_reconfiguration",
    "scale_plan",
]

logger = logging.getLogger(__name__)

Launch = Callable[[int, Reservation], None]  # (reconfiguration id, reservation) -> starts it


# -- plan builders (run on the engine's loop against the current abstraction) ------------------


def parse_plan(document: Mapping[str, Any]) -> PlanBuilder:
    """A builder returning the plan ``document`` describes; :class:`PlanRefused` now if
    the document is malformed."""
    try:
        plan = Plan.from_dict(dict(document))
    except AbstractionError as exc:
        raise from_abstraction_error(exc) from None
    return lambda _view: plan


def scale_plan(operator: str, parallelism: int, workers: Sequence[str] | None) -> PlanBuilder:
    def build(view: JobView) -> Plan:
        plan = scale(view.abstraction, operator, parallelism, workers=workers)
        if not plan.ops:
            raise PlanRefused(
                f"operator {operator!r} already has {parallelism} tasks", code="no_change"
            )
        return plan

    return build


def rebalance_plan(
    operator: str, loads: Mapping[str, float] | None, threshold: float, window_s: float
) -> PlanBuilder:
    def build(view: JobView) -> Plan:
        op = view.abstraction.operator(operator)
        given: Mapping[Any, float] | None = loads
        if op.keyed and loads is not None:
            given = {_key_group(k, operator): v for k, v in loads.items()}
        elif op.keyed:
            given = view.key_group_loads(operator, window_s) or None
        plan = rebalance(view.abstraction, operator, given, threshold=threshold)
        if not plan.ops:
            measure = ""
            if op.keyed:
                per_task = [
                    sum(given.get(g, 0.0) for g in t.workload.key_groups or ())
                    if given
                    else len(t.workload.key_groups or ())
                    for t in op.tasks
                ]
                measure = f" (imbalance {imbalance(per_task):.3f})"
            raise PlanRefused(
                f"operator {operator!r} is already balanced{measure} within the threshold "
                f"{threshold:g}",
                code="no_change",
            )
        return plan

    return build


STATE_WINDOW_S = 10.0  # batch_bytes is turned into key groups from this much measurement


def paced(
    build: PlanBuilder, mode: str, batch_size: int | None, batch_bytes: int | None = None
) -> PlanBuilder:
    """``build``'s plan carried out in ``mode`` (``fluid``: ``batch_size`` key groups per
    step, or as many as make about ``batch_bytes`` of state, see :func:`batch_for_bytes`);
    :class:`PlanRefused` for a batch size without fluid mode."""

    def paced_build(view: JobView) -> Plan:
        try:
            plan = build(view)
            size = batch_size if batch_bytes is None else batch_for_bytes(view, plan, batch_bytes)
            return replace(plan, mode=mode, batch_size=size)
        except AbstractionError as exc:
            raise from_abstraction_error(exc) from None

    return paced_build


def batch_for_bytes(view: JobView, plan: Plan, batch_bytes: int) -> int | None:
    """Key groups per task per step that make about ``batch_bytes`` of state, at the
    largest state per key group measured among the keyed operators whose work or tasks
    ``plan`` moves (at least 1); None (one step) when nothing keyed moves or their state
    is empty. :class:`PlanRefused` when no state size of one of them was measured."""
    a = view.abstraction
    tasks = {t.id: op.name for op in a.operators for t in op.tasks}
    moved = {op.operator for op in plan.ops if isinstance(op, AssignWorkload)}
    moved |= {
        tasks[op.task] for op in plan.ops if isinstance(op, AssignResource) and op.task in tasks
    }
    per_group = []
    for name in sorted(n for n in moved if a.operator(n).keyed):
        measured = view.key_group_bytes(name, STATE_WINDOW_S)
        if measured is None:
            raise PlanRefused(
                f"no state size of operator {name!r} was reported in the last "
                f"{STATE_WINDOW_S:g}s: give batch_size (key groups per step) instead of "
                "batch_bytes"
            )
        per_group.append(measured)
    largest = max(per_group, default=0.0)
    return max(1, int(batch_bytes // largest)) if largest > 0 else None


def _key_group(key: str, operator: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise PlanRefused(
            f"loads of keyed operator {operator!r} are per key group: {key!r} is not an int",
            code="invalid_plan",
        ) from None


def migrate_plan(task: str, worker: str, with_forward: bool = False) -> PlanBuilder:
    def build(view: JobView) -> Plan:
        plan = migrate(view.abstraction, task, worker, with_forward=with_forward)
        if not plan.ops:
            what = f"task {task!r} " + ("and its forward partners run" if with_forward else "runs")
            raise PlanRefused(f"{what} already on worker {worker!r}", code="no_change")
        return plan

    return build


def logic_plan(operator: str, ref: str, tasks: Sequence[str] | None) -> PlanBuilder:
    return lambda view: update_logic(view.abstraction, operator, ref, tasks)


# -- requests and records --------------------------------------------------------------------


def request_reconfiguration(
    *,
    session: Session,
    engine: Engine,
    launch: Launch,
    job_id: int,
    origin: str,
    build: PlanBuilder,
    may_start_workers: bool,
) -> ReconfigurationRecord:
    """Validate the plan ``build`` makes for the job and record it ``pending``; ``launch``
    starts it once the unit of work has committed (the job is released if it rolls back).
    A plan that starts workers is :class:`~controlplane.errors.Forbidden` unless
    ``may_start_workers`` (see :meth:`Engine.reserve`)."""
    job = jobs.get_job(session=session, engine=engine, job_id=job_id)
    if job.status in TERMINAL_JOB_STATUSES:
        raise JobNotRunning(f"job {job_id} is {job.status}: only a running job can be reconfigured")
    try:
        reservation = engine.reserve(job_key(job.id), build, may_start_workers=may_start_workers)
    except ReconfigurationInProgress as exc:
        raise _naming_the_one_under_way(session, job_id, exc) from None
    db.after_rollback(session, lambda: engine.release(reservation))
    plan = reservation.plan
    rec = ReconfigurationRecord(
        job_id=job_id,
        origin=origin,
        plan=plan.to_dict(),
        status=ReconfigurationStatus.PENDING,
        affected_tasks=list(reservation.affected),
        error=None,
        timings_ms={},
        pause_ms={},
        update_ms={},
        runs=None,
        stage_ms=[],
        precopied={},
        base_version=plan.base_version,
        result_version=None,
        runtime_id=None,
    )
    session.add(rec)
    session.flush()
    reconfiguration_id = rec.id
    db.after_commit(session, lambda: launch(reconfiguration_id, reservation))
    logger.info("job %s: reconfiguration %s (%s) accepted", job_id, reconfiguration_id, origin)
    return rec


def _naming_the_one_under_way(
    session: Session, job_id: int, refusal: ReconfigurationInProgress
) -> ReconfigurationInProgress:
    """The engine's refusal (it alone decides that the job is busy), worded with the record
    of the reconfiguration under way when there is one."""
    busy = session.scalar(
        select(ReconfigurationRecord)
        .where(
            ReconfigurationRecord.job_id == job_id,
            ReconfigurationRecord.status.not_in(TERMINAL_RECONFIGURATION_STATUSES),
        )
        .order_by(ReconfigurationRecord.id.desc())
        .limit(1)
    )
    if busy is None:
        return refusal
    return ReconfigurationInProgress(
        f"reconfiguration {busy.id} of job {job_id} is {busy.status}; wait until it has "
        "ended, then build the plan on the version it leaves"
    )


def preview_reconfiguration(
    *,
    session: Session,
    engine: Engine,
    job_id: int,
    origin: str,
    build: PlanBuilder,
    may_start_workers: bool,
) -> PreviewRead:
    """What the plan ``build`` makes would do to the job (see :meth:`Engine.preview`),
    refused as :func:`request_reconfiguration` refuses it (but for a change under way)."""
    job = jobs.get_job(session=session, engine=engine, job_id=job_id)
    if job.status in TERMINAL_JOB_STATUSES:
        raise JobNotRunning(f"job {job_id} is {job.status}: only a running job can be reconfigured")
    seen = engine.preview(
        job_key(job.id), build, STATE_WINDOW_S, may_start_workers=may_start_workers
    )
    plan = seen.plan
    return PreviewRead.model_validate(
        {
            "origin": origin,
            "base_version": plan.base_version,
            "result_version": plan.base_version + seen.steps,
            "mode": plan.mode,
            "batch_size": plan.batch_size,
            "ops": plan.to_dict()["ops"],
            "affected_tasks": list(seen.affected),
            "steps": seen.steps,
            "key_group_moves": sum(len(op["key_group_moves"]) for op in seen.diff["operators"]),
            "state_bytes_shipped": seen.state_bytes_shipped,
            "largest_step_bytes": seen.largest_step_bytes,
            "diff": seen.diff,
        }
    )


def cancel_reconfiguration(
    *, session: Session, engine: Engine, job_id: int, reconfiguration_id: int
) -> ReconfigurationRecord:
    """Ask the engine to cancel the reconfiguration (see :meth:`Engine.cancel`): it ends
    ``cancelled`` at its next safe point, its error saying what stays applied.
    :class:`NotCancellable` when it has ended or cannot be stopped now."""
    rec = get_reconfiguration(session=session, job_id=job_id, reconfiguration_id=reconfiguration_id)
    if rec.status in TERMINAL_RECONFIGURATION_STATUSES:
        raise NotCancellable(f"reconfiguration {rec.id} of job {job_id} has ended: it {rec.status}")
    engine.cancel(job_key(job_id), "cancelled on request")
    logger.info("job %s: reconfiguration %s asked to cancel", job_id, rec.id)
    return rec


def get_reconfiguration(
    *, session: Session, job_id: int, reconfiguration_id: int
) -> ReconfigurationRecord:
    rec = session.get(ReconfigurationRecord, reconfiguration_id)
    if rec is None or rec.job_id != job_id:
        jobs.get_row(session=session, job_id=job_id)
        raise NotFound(f"job {job_id} has no reconfiguration {reconfiguration_id}")
    return rec


def list_reconfigurations(
    *, session: Session, job_id: int, limit: int, offset: int
) -> tuple[list[ReconfigurationRecord], int]:
    """A page of the job's reconfigurations, newest first, and how many there are."""
    jobs.get_row(session=session, job_id=job_id)
    query = select(ReconfigurationRecord).where(ReconfigurationRecord.job_id == job_id)
    return fetch_page(session, query, ReconfigurationRecord.id.desc(), limit, offset)


def record_recovery(
    *,
    session: Session,
    job_id: int,
    reported: Mapping[str, Any],
    plan: Mapping[str, Any],
    base_version: int,
    document: dict[str, Any],
) -> ReconfigurationRecord:
    """Record a recovery the coordinator made (:mod:`controlplane.coordinator.recovery`):
    a completed reconfiguration with origin ``recovery``, no operations, whose plan's
    ``recovery`` says why (``reason``, ``checkpoint_id``, ``lost_workers``,
    ``placed_on``), and the version it made."""
    why = {k: plan[k] for k in ("reason", "checkpoint_id", "lost_workers", "placed_on")}
    why["restored"] = dict(plan.get("restored") or {})
    why["timings_ms"] = dict(reported["timings_ms"])
    rec = ReconfigurationRecord(
        job_id=job_id,
        origin="recovery",
        plan={"base_version": base_version, "mode": "pause", "ops": [], "recovery": why},
        base_version=base_version,
        result_version=int(document["job"]["version"]),
        ended_at=db.utcnow(),
        **{column: value for column, value in reported.items()},
    )
    session.add(rec)
    session.flush()
    job = jobs.get_row(session=session, job_id=job_id)
    versions.add_version(session=session, job=job, document=document, reconfiguration_id=rec.id)
    total = reported["timings_ms"].get("total")
    events.record(
        session=session,
        kind="job.recovered",
        job_id=job_id,
        message=f"job {job_id} recovered from checkpoint {plan.get('checkpoint_id')} "
        f"as version {rec.result_version}"
        + (f" in {total:.0f} ms" if total is not None else "")
        + f": {plan.get('reason')}",
        data={"reconfiguration": rec.id, "plan": dict(plan)},
    )
    session.flush()
    return rec


def record_progress(*, session: Session, reconfiguration_id: int, progress: Progress) -> None:
    """Store what the engine reported; a final report also records the abstraction
    versions it made. A record that has ended is not changed again."""
    rec = session.get(ReconfigurationRecord, reconfiguration_id)
    if rec is None or rec.status in TERMINAL_RECONFIGURATION_STATUSES:
        return
    for column, value in progress.reported.items():  # named as the columns (RunReport.reported)
        setattr(rec, column, value)
    if progress.done:
        rec.ended_at = db.utcnow()
        timings = dict(progress.reported["timings_ms"])
        total = timings.get("total")
        took = f" in {total:.1f} ms" if total is not None else ""
        why = f": {progress.error}" if progress.error else ""
        events.record(
            session=session,
            kind=f"reconfiguration.{progress.status}",
            job_id=rec.job_id,
            message=f"reconfiguration {rec.id} ({rec.origin}) of job {rec.job_id} "
            f"{progress.status}{took}{why}",
            data={"reconfiguration": rec.id, "timings_ms": timings},
        )
    if progress.status == ReconfigurationStatus.COMPLETED or progress.abstractions:
        rec.result_version = progress.version
        job = jobs.get_row(session=session, job_id=rec.job_id)
        for document in progress.abstractions:
            versions.add_version(
                session=session, job=job, document=document, reconfiguration_id=rec.id
            )
    session.flush()


def fail_unfinished(*, session: Session, reason: str) -> int:
    """Mark every reconfiguration that has not ended ``failed`` with ``reason`` (at
    start-up and shutdown: nothing is carrying them out any more). Returns how many."""
    rows = list(
        session.scalars(
            select(ReconfigurationRecord).where(
                ReconfigurationRecord.status.not_in(TERMINAL_RECONFIGURATION_STATUSES)
            )
        )
    )
    for rec in rows:
        rec.error = rec.error or f"{reason} (it was {rec.status})"
        rec.status = ReconfigurationStatus.FAILED
        rec.ended_at = db.utcnow()
    session.flush()
    return len(rows)
