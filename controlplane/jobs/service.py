"""Jobs: submit (build the graph from registered code in a throwaway process, deploy it,
record it), list, get, stop, and keeping each row's status in step with the coordinator.

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
from controlplane.checkpoints.policy import policy_for, to_document
from controlplane.checkpoints.schemas import CheckpointSettings
from controlplane.engine import Engine, JobState, job_key
from controlplane.errors import NotFound
from controlplane.events import service as events
from controlplane.pagination import fetch_page
from controlplane.statuses import JobStatus
from controlplane.versions import service as versions

from .build import build_graph, job_dir, registered_job
from .models import JOB_STATUSES, TERMINAL_JOB_STATUSES, JobRecord

__all__ = [
    "get_job",
    "get_row",
    "list_jobs",
    "mark_unreachable",
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
) -> JobRecord:
    """Record, build and deploy a job under its new id (with abstraction version 1 when it
    deployed). ``ref`` must name registered code, and the graph is built in a throwaway
    process (:func:`.build.build_graph`: :class:`BadJob` with the reason, nothing
    recorded); its sinks write under the job's directory unless ``write_anywhere`` (an
    admin's job). It is checkpointed as ``checkpoints`` asks over the server's defaults
    (:func:`~controlplane.checkpoints.policy.policy_for`), the policy recorded with it.
    The job may be recorded ``failed`` with the cause (e.g. a worker could not import
    it). If the unit of work rolls back, the deployed job is stopped."""
    target = registered_job(engine.settings, ref)
    policy = policy_for(engine.settings, checkpoints)
    job = JobRecord(
        name=name,
        job_ref=ref,
        params=dict(params),
        status=JobStatus.STARTING,
        error=None,
        version=None,
        checkpoints=to_document(policy),
    )
    session.add(job)
    session.flush()  # the id names the deployed job and its directory
    key = job_key(job.id)
    directory = job_dir(engine.settings, key)
    graph = build_graph(
        target,
        params,
        directory=directory,
        write_anywhere=write_anywhere,
        settings=engine.settings,
    )
    state = engine.submit(graph, key, checkpoints=policy)
    db.after_rollback(session, lambda: engine.stop(key))
    events.record(
        session=session,
        kind="job.submitted",
        job_id=job.id,
        message=f"job {job.id} ({name}) submitted: {ref}",
        data={"job": ref, "params": dict(params)},
    )
    _update(job, state.status, state.error)
    if state.abstraction is not None:
        versions.add_version(session=session, job=job, document=state.abstraction)
    logger.info("job %s submitted: %s", job.id, state.status)
    return job


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
