"""Jobs: submit (build the graph from registered code in a throwaway process, deploy it,
record it), list, get, stop, keeping each row's status in step with the coordinator, and
what a recorded job takes to deploy again (:func:`rebuild_graph`, :func:`policies_of`).

Functions take the session as a keyword argument and never commit. A row's status is the
coordinator's as last seen: reads refresh it, and :mod:`controlplane.tracking` mirrors it
in the background. Rows that have reached a final status (finished, failed, stopped)
never change again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, object_session

from controlplane import db
from controlplane.checkpoints.policy import (
    from_document,
    policy_for,
    restart_from_document,
    restart_policy_for,
    restart_to_document,
    to_document,
)
from controlplane.checkpoints.restore import check_fits, savepoint_manifest
from controlplane.checkpoints.schemas import CheckpointSettings, RestartSettings
from controlplane.config import Settings
from controlplane.coordinator.checkpoint_report import CheckpointPolicy, RestartPolicy
from controlplane.engine import Engine, JobState, job_key
from controlplane.errors import BadJob, InvalidRequest, NotFound
from controlplane.events import service as events
from controlplane.pagination import fetch_page
from controlplane.statuses import JobStatus
from controlplane.versions import service as versions
from runtime.dataflow import JobGraph
from runtime.jobbuild import SinkPath

from .build import build_graph, job_dir, registered_job
from .models import JOB_STATUSES, TERMINAL_JOB_STATUSES, JobRecord

__all__ = [
    "delivery_of",
    "get_job",
    "get_row",
    "list_jobs",
    "mark_unreachable",
    "policies_of",
    "rebuild_graph",
    "refresh",
    "stop_job",
    "submit_job",
    "sync_states",
]

logger = logging.getLogger(__name__)

_LIVE = tuple(s for s in JOB_STATUSES if s not in TERMINAL_JOB_STATUSES)


def submit_job(
    *,
    session: Session,
    engine: Engine,
    name: str,
    ref: str,
    params: Mapping[str, Any],
    write_anywhere: bool = False,
    checkpoints: CheckpointSettings | None = None,
    restart: RestartSettings | None = None,
    from_savepoint: str | None = None,
) -> JobRecord:
    """Record, build and deploy a job under its new id (with abstraction version 1 when it
    deployed). ``ref`` must name registered code, and the graph is built in a throwaway
    process (:func:`.build.build_graph`: :class:`BadJob` with the reason, nothing
    recorded); its sinks write under the job's directory unless ``write_anywhere`` (an
    admin's job). It is checkpointed as ``checkpoints`` asks and recovers from failures as
    ``restart`` allows, over the server's defaults
    (:func:`~controlplane.checkpoints.policy.policy_for`,
    :func:`~controlplane.checkpoints.policy.restart_policy_for`); the row records both
    policies and everything :func:`rebuild_graph` needs. The job may be recorded
    ``failed`` with the cause (e.g. a worker could not import it). If the unit of work
    rolls back, the deployed job is stopped.

    With ``from_savepoint`` (``"<job id>/<savepoint id>"``) it starts from that
    savepoint, read and checked to fit the built graph before anything is deployed
    (:mod:`controlplane.checkpoints.restore`: :class:`InvalidRequest` or
    :class:`~controlplane.errors.Conflict` saying what to fix); it must take
    checkpoints."""
    settings = engine.settings
    target = registered_job(settings, ref)
    policy = policy_for(settings, checkpoints)
    restart_policy = restart_policy_for(settings, restart)
    savepoint = None
    if from_savepoint is not None:
        if policy is None:
            raise InvalidRequest(
                "a job started from a savepoint takes checkpoints (its state is restored "
                'through them): drop "checkpoints": {"interval_s": null}',
                code="invalid_checkpoints",
            )
        savepoint = savepoint_manifest(session=session, settings=settings, ref=from_savepoint)
    job = JobRecord(
        name=name,
        job_ref=ref,
        params=dict(params),
        status=JobStatus.STARTING,
        error=None,
        version=None,
        checkpoints=to_document(policy),
        restart=restart_to_document(restart_policy),
        write_anywhere=write_anywhere,
        from_savepoint=from_savepoint,
    )
    session.add(job)
    session.flush()  # the id names the deployed job and its directory
    graph, sinks = _build(settings, job, target)
    if savepoint is not None:
        check_fits(savepoint, graph, from_savepoint or "")
    job.delivery = delivery_of(sinks, checkpointed=policy is not None)
    key = job_key(job.id)
    state = engine.submit(
        graph, key, checkpoints=policy, restart=restart_policy, from_savepoint=savepoint
    )
    db.after_rollback(session, lambda: engine.stop(key))
    events.record(
        session=session,
        kind="job.submitted",
        job_id=job.id,
        message=f"job {job.id} ({name}) submitted: {ref}",
        data={"job": ref, "params": dict(params), "delivery": job.delivery},
    )
    _update(job, state.status, state.error)
    if state.abstraction is not None:
        versions.add_version(session=session, job=job, document=state.abstraction)
    logger.info("job %s submitted: %s", job.id, state.status)
    return job


def delivery_of(sinks: list[SinkPath], *, checkpointed: bool) -> dict[str, str]:
    """What each of a job's ``sinks`` guarantees through failures: ``exactly-once`` when
    the job takes checkpoints and the sink commits with them (``Sink.exactly_once``),
    ``at-least-once`` when it does not, ``none`` without checkpoints (a failure fails
    the job)."""
    if not checkpointed:
        return {s.operator: "none" for s in sinks}
    return {s.operator: "exactly-once" if s.exactly_once else "at-least-once" for s in sinks}


def rebuild_graph(*, settings: Settings, job: JobRecord) -> JobGraph:
    """The graph of the recorded ``job``, built as :func:`submit_job` built it: its
    ``job_ref`` resolved to registered code again, with its params, in its directory, its
    sinks confined there unless it was submitted with ``write_anywhere``. Runs the build's
    throwaway process (:func:`.build.build_graph`, at most
    :data:`~.build.BUILD_TIMEOUT_S`); touches neither the row nor the coordinator.

    Raises :class:`BadJob`: ``bad_job_ref`` naming the job when its code is no longer
    registered (the module left ``STREAMPILOT_JOB_MODULES``, the callable is gone), and
    the build's codes otherwise (``job_build_failed``, ``invalid_job``,
    ``sink_path_refused``, ...)."""
    try:
        target = registered_job(settings, job.job_ref)
    except BadJob as exc:
        raise BadJob(
            f"job {job.id} ({job.name}) cannot be built again: its code is no longer "
            f"registered: {exc.message}",
            code=exc.code,
        ) from None
    return _build(settings, job, target)[0]


def policies_of(
    job: JobRecord, settings: Settings
) -> tuple[CheckpointPolicy | None, RestartPolicy]:
    """The checkpoint policy (None: not checkpointed) and the restart policy the recorded
    ``job`` was deployed with; a job recorded before restart policies were gets the
    server's default one from ``settings``."""
    return from_document(job.checkpoints), restart_from_document(job.restart, settings)


def _build(settings: Settings, job: JobRecord, target: str) -> tuple[JobGraph, list[SinkPath]]:
    """The one way a job row becomes a graph (a submission's, or again): registered code
    ``target`` (what ``job.job_ref`` resolved to) with the row's params, directory and
    ``write_anywhere``."""
    return build_graph(
        target,
        job.params,
        directory=job_dir(settings, job_key(job.id)),
        write_anywhere=job.write_anywhere,
        settings=settings,
    )


def get_row(*, session: Session, job_id: int) -> JobRecord:
    """The job's row as stored; :class:`NotFound` if there is none."""
    job = session.get(JobRecord, job_id)
    if job is None:
        raise NotFound(f"job {job_id} does not exist")
    return job


def get_job(*, session: Session, engine: Engine, job_id: int) -> JobRecord:
    """The job, its status refreshed from the coordinator."""
    job = get_row(session=session, job_id=job_id)
    if job.status not in TERMINAL_JOB_STATUSES:
        refresh(job, engine.state(job_key(job.id)))
    return job


def list_jobs(
    *, session: Session, engine: Engine, limit: int, offset: int, status: str | None = None
) -> tuple[list[JobRecord], int]:
    """A page of jobs, newest first (optionally only those in ``status``), and the total."""
    query = select(JobRecord)
    if status is not None:
        query = query.where(JobRecord.status == status)
    jobs, total = fetch_page(session, query, JobRecord.id.desc(), limit, offset)
    if any(j.status not in TERMINAL_JOB_STATUSES for j in jobs):
        states = engine.all_states()
        for job in jobs:
            if job.status not in TERMINAL_JOB_STATUSES:
                refresh(job, states.get(job_key(job.id)))
    return jobs, total


def stop_job(*, session: Session, engine: Engine, job_id: int) -> JobRecord:
    """Stop the job; a job that has already ended is returned as it is."""
    job = get_row(session=session, job_id=job_id)
    if job.status in TERMINAL_JOB_STATUSES:
        return job
    state = engine.stop(job_key(job.id))
    if state is None:
        mark_unreachable(job, "the job is not deployed on this control plane")
    else:
        refresh(job, state)
    session.flush()
    return job


def refresh(job: JobRecord, state: JobState | None) -> bool:
    """Copy the coordinator's status and error into a job that has not ended; True if it
    changed. Not its version: the job's version advances as the versions are recorded
    (:func:`controlplane.versions.service.add_version`), so the version a job shows can
    always be read, even while a fluid change makes one after another."""
    if state is None or job.status in TERMINAL_JOB_STATUSES:
        return False
    if (job.status, job.error) == (state.status, state.error):
        return False
    _update(job, state.status, state.error)
    return True


def mark_unreachable(job: JobRecord, reason: str) -> None:
    """Record that a job which has not ended can no longer be followed (its workers are
    gone): it is ``failed`` with ``reason``."""
    if job.status not in TERMINAL_JOB_STATUSES:
        _update(job, "failed", reason)


def _update(job: JobRecord, status: str, error: str | None) -> None:
    """Set the job's status, with an event when it starts running or ends.

    Requests and the tracker refresh jobs concurrently, each in its own transaction: such
    a transition is made by an UPDATE guarded by the status this session had read, and
    only the session whose UPDATE changed the row records the event; a session that lost
    the race takes the row as the winner left it.
    """
    before = job.status
    session = object_session(job)
    if (
        session is None
        or status == before
        or not (
            status in TERMINAL_JOB_STATUSES
            or (status == JobStatus.RUNNING and before == JobStatus.STARTING)
        )
    ):
        job.status, job.error = status, error
        return
    session.flush()  # the row as this session has it
    moved = session.execute(
        update(JobRecord)
        .where(JobRecord.id == job.id, JobRecord.status == before)
        .values(status=status, error=error)
        .execution_options(synchronize_session=False)
    )
    if moved.rowcount != 1:  # another transaction made the change first
        session.refresh(job)
        return
    job.status, job.error = status, error
    why = f": {error}" if error else ""
    events.record(
        session=session,
        kind=f"job.{status}",
        job_id=job.id,
        message=f"job {job.id} ({job.name}) {status}{why}",
        data={"error": error} if error else {},
    )


def sync_states(
    *, session: Session, states: Mapping[str, JobState], missing: str | None = None
) -> int:
    """Refresh every job that has not ended from ``states`` (by :func:`job_key`). With
    ``missing``, a job absent from ``states`` is marked failed with that reason. Returns
    how many rows changed."""
    changed = 0
    # In id order, as pages of jobs are: concurrent refreshes lock rows in one order.
    for job in session.scalars(
        select(JobRecord).where(JobRecord.status.in_(_LIVE)).order_by(JobRecord.id.desc())
    ):
        state = states.get(job_key(job.id))
        if state is not None:
            changed += refresh(job, state)
        elif missing is not None:
            mark_unreachable(job, missing)
            changed += 1
    session.flush()
    return changed
