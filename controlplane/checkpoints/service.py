"""Checkpoints: record what the coordinator reports of each (checkpoints and savepoints:
one table, their ``kind`` apart), list them, get one, and find the latest completed one.
Listing, getting and the latest completed one are of ``checkpoint`` rows only; savepoints
are :mod:`.savepoints`'.

Functions take the session as a keyword argument and never commit. A checkpoint has one
row per job and coordinator id (``checkpoint_id``), inserted at its first report and
updated by the later ones. Reports move a checkpoint forward only: ``in_progress`` to
``completed`` or ``abandoned``, ``completed`` to ``discarded``; a report that would take an
ended checkpoint back (one written late) leaves the row as it is. The reports of one
job's checkpoints are written one after another, in the order the coordinator made them
(as a reconfiguration's progress is): two units of work inserting the same new
checkpoint at once would collide on the unique (job_id, checkpoint_id).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.coordinator.checkpoint_report import CheckpointKind
from controlplane.errors import NotFound
from controlplane.jobs import service as jobs
from controlplane.pagination import fetch_page
from controlplane.statuses import CheckpointStatus

from .models import CheckpointRecord

__all__ = [
    "abandon_unfinished",
    "count",
    "discard",
    "get",
    "latest_completed",
    "list_for_job",
    "record",
]

logger = logging.getLogger(__name__)

# What each status may become by a later report (itself: the same status, updated).
_NEXT: dict[str, frozenset[CheckpointStatus]] = {
    CheckpointStatus.IN_PROGRESS: frozenset(CheckpointStatus),
    CheckpointStatus.COMPLETED: frozenset({CheckpointStatus.COMPLETED, CheckpointStatus.DISCARDED}),
    CheckpointStatus.ABANDONED: frozenset({CheckpointStatus.ABANDONED}),
    CheckpointStatus.DISCARDED: frozenset({CheckpointStatus.DISCARDED}),
}


def record(*, session: Session, job_db_id: int, reported: Mapping[str, Any]) -> CheckpointRecord:
    """Store a checkpoint report of job ``job_db_id`` (the jobs row's id, i.e. ``int`` of
    the coordinator's job id, see :func:`controlplane.engine.job_key`): ``reported`` is
    :meth:`CheckpointReport.reported() <controlplane.coordinator.checkpoint_report.CheckpointReport.reported>`,
    its ``started_at`` in epoch seconds. Inserts the checkpoint's row at its first report
    and updates it after; a report that would take an ended checkpoint back is ignored
    (see the module docstring). Returns the row, flushed. :class:`NotFound` for an unknown
    job; ``KeyError`` / ``ValueError`` for a report missing a field or with an unknown
    status (a bug of the caller)."""
    status = CheckpointStatus(reported["status"])
    checkpoint_id = int(reported["checkpoint_id"])
    rec = session.scalar(
        select(CheckpointRecord).where(
            CheckpointRecord.job_id == job_db_id, CheckpointRecord.checkpoint_id == checkpoint_id
        )
    )
    if rec is None:
        jobs.get_row(session=session, job_id=job_db_id)
        rec = CheckpointRecord(job_id=job_db_id, checkpoint_id=checkpoint_id)
        session.add(rec)
    elif status not in _NEXT[rec.status]:
        logger.debug(
            "job %s: checkpoint %s is %s; a late report (%s) is ignored",
            job_db_id,
            checkpoint_id,
            rec.status,
            status,
        )
        return rec
    rec.kind = str(CheckpointKind(reported.get("kind", CheckpointKind.CHECKPOINT)))
    rec.version = reported["version"]
    rec.status = status
    rec.error = reported["error"]
    rec.path = reported["path"]
    rec.bytes = int(reported["bytes"])
    rec.full_bytes = int(reported["full_bytes"])
    rec.tasks = int(reported["tasks"])
    rec.started_at = datetime.fromtimestamp(reported["started_at"], UTC)
    rec.duration_ms = reported["duration_ms"]
    session.flush()
    return rec


def discard(*, session: Session, job_db_id: int, checkpoint_id: int) -> None:
    """Retention let completed checkpoint ``checkpoint_id`` go: its row says ``discarded``
    (one not recorded, or not completed, is left as it is)."""
    rec = session.scalar(
        select(CheckpointRecord).where(
            CheckpointRecord.job_id == job_db_id, CheckpointRecord.checkpoint_id == checkpoint_id
        )
    )
    if rec is not None and rec.status == CheckpointStatus.COMPLETED:
        rec.status = CheckpointStatus.DISCARDED
        session.flush()


def count(*, session: Session, job_id: int, statuses: Iterable[str]) -> int:
    """How many of the job's checkpoints (not savepoints) are in one of ``statuses``."""
    return (
        session.scalar(
            select(func.count()).where(
                CheckpointRecord.job_id == job_id,
                CheckpointRecord.kind == CheckpointKind.CHECKPOINT,
                CheckpointRecord.status.in_([str(s) for s in statuses]),
            )
        )
        or 0
    )


def list_for_job(
    *,
    session: Session,
    job_id: int,
    limit: int,
    offset: int,
    status: str | None = None,
    kind: CheckpointKind = CheckpointKind.CHECKPOINT,
) -> tuple[list[CheckpointRecord], int]:
    """A page of the job's checkpoints (or savepoints: ``kind``), newest first
    (optionally only those in ``status``), and how many there are. :class:`NotFound` for
    an unknown job."""
    jobs.get_row(session=session, job_id=job_id)
    query = select(CheckpointRecord).where(
        CheckpointRecord.job_id == job_id, CheckpointRecord.kind == kind
    )
    if status is not None:
        query = query.where(CheckpointRecord.status == status)
    return fetch_page(session, query, CheckpointRecord.checkpoint_id.desc(), limit, offset)


def get(
    *,
    session: Session,
    job_id: int,
    checkpoint_id: int,
    kind: CheckpointKind = CheckpointKind.CHECKPOINT,
) -> CheckpointRecord:
    """Checkpoint (or savepoint: ``kind``) ``checkpoint_id`` (the coordinator's id) of
    the job; :class:`NotFound` naming the job when it does not exist, else naming the
    checkpoint."""
    rec = session.scalar(
        select(CheckpointRecord).where(
            CheckpointRecord.job_id == job_id,
            CheckpointRecord.checkpoint_id == checkpoint_id,
            CheckpointRecord.kind == kind,
        )
    )
    if rec is None:
        jobs.get_row(session=session, job_id=job_id)
        raise NotFound(f"job {job_id} has no {kind} {checkpoint_id}")
    return rec


def latest_completed(*, session: Session, job_db_id: int) -> CheckpointRecord | None:
    """The job's newest ``completed`` checkpoint (the one a restore would read), or None."""
    return session.scalar(
        select(CheckpointRecord)
        .where(
            CheckpointRecord.job_id == job_db_id,
            CheckpointRecord.kind == CheckpointKind.CHECKPOINT,
            CheckpointRecord.status == CheckpointStatus.COMPLETED,
        )
        .order_by(CheckpointRecord.checkpoint_id.desc())
        .limit(1)
    )


def abandon_unfinished(*, session: Session, reason: str) -> int:
    """Mark every checkpoint still ``in_progress`` ``abandoned`` with ``reason`` (at
    start-up and shutdown: no coordinator is taking them any more; their duration stays
    unknown). Returns how many."""
    rows = list(
        session.scalars(
            select(CheckpointRecord).where(CheckpointRecord.status == CheckpointStatus.IN_PROGRESS)
        )
    )
    for rec in rows:
        rec.status = CheckpointStatus.ABANDONED
        rec.error = rec.error or reason
    session.flush()
    return len(rows)
