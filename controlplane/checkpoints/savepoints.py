"""Savepoints: take one of a running job (and stop it with it), list them, get one,
delete one.

A savepoint is a checkpoint taken on request (its row in ``checkpoints`` has ``kind``
``savepoint``; the coordinator's reports of it are recorded as a checkpoint's are). It is
kept, with the files of earlier checkpoints its chains refer to, until it is deleted:
retention never counts it nor removes what it refers to.

Functions take the session as a keyword argument and never commit.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from controlplane.coordinator.checkpoint_protocol import checkpoint_dir, referenced
from controlplane.coordinator.checkpoint_report import CheckpointKind
from controlplane.coordinator.checkpointer import manifest_path
from controlplane.coordinator.from_savepoint import stored_savepoints
from controlplane.engine import Engine, job_key
from controlplane.errors import Conflict, JobNotRunning, Unavailable
from controlplane.jobs import service as jobs
from controlplane.jobs.models import TERMINAL_JOB_STATUSES
from controlplane.statuses import CheckpointStatus
from runtime.checkpoints.store import CheckpointStoreError, open_store

from . import service
from .models import CheckpointRecord
from .schemas import SavepointRead

__all__ = ["delete", "get", "list_for_job", "take"]

logger = logging.getLogger(__name__)


def take(*, session: Session, engine: Engine, job_id: int, stop: bool) -> SavepointRead:
    """Take a savepoint of running job ``job_id`` and wait until it is complete; with
    ``stop``, the job is then stopped, its sinks having committed everything up to the
    savepoint (its row says ``stopped`` on return). It waits behind a checkpoint in
    flight and a reconfiguration under way. :class:`NotFound` for an unknown job;
    :class:`JobNotRunning` for one that is not running; :class:`Conflict`
    (``savepoint_refused``, ``savepoint_abandoned``) saying why no savepoint was taken
    (the job then runs on)."""
    job = jobs.get_row(session=session, job_id=job_id)
    if job.status in TERMINAL_JOB_STATUSES:
        raise JobNotRunning(f"job {job_id} is {job.status}: only a running job takes a savepoint")
    policy, _restart = jobs.policies_of(job, engine.settings)
    if policy is None:
        raise Conflict(
            f"job {job_id} takes no checkpoints, and a savepoint is one: submit the job with "
            'checkpoints on (leave out "checkpoints": {"interval_s": null}) to take savepoints',
            code="savepoint_refused",
        )
    reported = engine.savepoint(job_key(job_id), stop=stop, timeout_s=policy.timeout_s)
    if stop:
        jobs.refresh(job, engine.state(job_key(job_id)))
        session.flush()
    return SavepointRead.of_report(job_id, reported)


def list_for_job(
    *, session: Session, job_id: int, limit: int, offset: int, status: str | None = None
) -> tuple[list[CheckpointRecord], int]:
    """A page of the job's savepoints, newest first (optionally only those in
    ``status``), and how many there are. :class:`NotFound` for an unknown job."""
    return service.list_for_job(
        session=session,
        job_id=job_id,
        limit=limit,
        offset=offset,
        status=status,
        kind=CheckpointKind.SAVEPOINT,
    )


def get(*, session: Session, job_id: int, savepoint_id: int) -> CheckpointRecord:
    """Savepoint ``savepoint_id`` of the job; :class:`NotFound` naming the job when it
    does not exist, else naming the savepoint."""
    return service.get(
        session=session, job_id=job_id, checkpoint_id=savepoint_id, kind=CheckpointKind.SAVEPOINT
    )


def delete(*, session: Session, engine: Engine, job_id: int, savepoint_id: int) -> None:
    """Delete savepoint ``savepoint_id`` of the job: its row, and its files.

    1. A savepoint in progress is :class:`Conflict` (wait for it to end).
    2. A completed one of a job running here: the job's checkpointer lets go of it (its
       manifest goes now, the files only it refers to once the next checkpoint completes:
       a recovery may still go back to it until then).
    3. A completed one of a job that has ended: its manifest, and the directories it
       refers to that no other savepoint of the job refers to, are removed now. A job
       that has not ended but does not run here (it is resuming) is :class:`Conflict`.

    An abandoned one has no files of its own to keep: only its row goes. Jobs started
    from the savepoint are not affected: they run on copies of its files.
    """
    rec = get(session=session, job_id=job_id, savepoint_id=savepoint_id)
    # Step 1.
    if rec.status == CheckpointStatus.IN_PROGRESS:
        raise Conflict(
            f"savepoint {savepoint_id} of job {job_id} is in progress: delete it once it ended",
            code="savepoint_in_progress",
        )
    if rec.status == CheckpointStatus.COMPLETED:
        key = job_key(job_id)
        # Step 2.
        if not engine.release_savepoint(key, savepoint_id):
            # Step 3.
            job = jobs.get_row(session=session, job_id=job_id)
            jobs.refresh(job, engine.state(key))
            if job.status not in TERMINAL_JOB_STATUSES:
                raise Conflict(
                    f"job {job_id} is {job.status} and not running here yet: delete its "
                    "savepoint once it runs (or has ended)",
                    code="savepoint_in_use",
                )
            _remove_files(engine, key, savepoint_id)
    session.delete(rec)
    session.flush()


def _remove_files(engine: Engine, key: str, savepoint_id: int) -> None:
    """Step 3: the savepoint's manifest and the directories only it refers to."""
    try:
        store = open_store(engine.settings.checkpoint_location())
        refs = {int(s["checkpoint_id"]): referenced(s) for s in stored_savepoints(store, key)}
        mine = refs.pop(savepoint_id, set())
        gone = mine - set().union(*refs.values())
        store.delete(manifest_path(key, savepoint_id, CheckpointKind.SAVEPOINT))
        for cid in sorted(gone):
            store.delete(checkpoint_dir(key, cid))
    except CheckpointStoreError as exc:
        raise Unavailable(
            f"the savepoint's files cannot be removed now ({exc}); try again"
        ) from None
    logger.info("job %s: savepoint %s deleted (%d directories)", key, savepoint_id, len(gone))
