"""Workers in the database: mirror the coordinator's registry (with an event for each
registration and loss), mark a previous run's workers lost, list the history. Functions
take the session as a keyword argument and never commit."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from controlplane.db import utcnow
from controlplane.engine import WorkerView
from controlplane.events import service as events
from controlplane.pagination import fetch_page
from controlplane.statuses import WorkerStatus

from .models import WorkerRecord

__all__ = ["end_alive", "list_history", "mirror"]


def mirror(*, session: Session, instance: str, views: Iterable[WorkerView]) -> int:
    """Insert or update the rows of this run's workers; returns how many changed."""
    rows = {
        r.worker_id: r
        for r in session.scalars(select(WorkerRecord).where(WorkerRecord.instance == instance))
    }
    changed = 0
    for v in views:
        row = rows.get(v.id)
        if row is None:
            row = WorkerRecord(
                instance=instance,
                worker_id=v.id,
                host=v.host,
                pid=v.pid,
                cpus=v.cpus,
                memory_mb=v.memory_mb,
                executor_id=v.executor_id,
                status=WorkerStatus.ALIVE,
                error=None,
            )
            session.add(row)
            changed += 1
            where = f" (Spark executor {v.executor_id})" if v.executor_id else ""
            events.record(
                session=session,
                kind="worker.registered",
                message=f"worker {v.id} registered: pid {v.pid} on {v.host}{where}",
                data={"worker": v.id, "host": v.host, "pid": v.pid},
            )
        if row.status == v.status and row.error == v.error:
            continue
        if row.status != WorkerStatus.ALIVE or v.status == WorkerStatus.ALIVE:
            row.error = v.error
            changed += 1
            continue
        row.status, row.error, row.ended_at = v.status, v.error, utcnow()
        changed += 1
        kind = "worker.lost" if v.status == WorkerStatus.LOST else "worker.stopped"
        reason = f": {v.error}" if v.error else ""
        events.record(
            session=session,
            kind=kind,
            message=f"worker {v.id} (pid {v.pid} on {v.host}) {v.status}{reason}",
            data={"worker": v.id, "error": v.error},
        )
    session.flush()
    return changed


def end_alive(*, session: Session, instance: str, this_run: bool, status: str, reason: str) -> int:
    """End the rows still recorded alive: this run's (``this_run``, at shutdown: they are
    ``stopped``) or every earlier run's (at start-up: they died with it, ``lost``)."""
    run = WorkerRecord.instance == instance if this_run else WorkerRecord.instance != instance
    result = session.execute(
        update(WorkerRecord)
        .where(run, WorkerRecord.status == WorkerStatus.ALIVE)
        .values(status=status, error=reason, ended_at=utcnow())
    )
    return int(getattr(result, "rowcount", 0) or 0)


def list_history(*, session: Session, limit: int, offset: int) -> tuple[list[WorkerRecord], int]:
    """Every worker of every run, newest first."""
    return fetch_page(session, select(WorkerRecord), WorkerRecord.id.desc(), limit, offset)
