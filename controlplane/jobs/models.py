"""The ``jobs`` table: one row per submitted job, mirroring the coordinator's state."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, String, Text, false
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, utcnow
from controlplane.statuses import JobStatus

__all__ = ["JOB_STATUSES", "TERMINAL_JOB_STATUSES", "JobRecord"]

JOB_STATUSES = tuple(JobStatus)
TERMINAL_JOB_STATUSES = frozenset(s for s in JobStatus if s.ended)


class JobRecord(Base):
    """A job as submitted (name, job reference, params) and as last seen running.

    The job is deployed under its id (``controlplane.engine.job_key``: the abstraction's
    ``job.id`` and worker messages use ``str(id)``); ``version`` is the current
    abstraction version (None if the job never deployed); ``checkpoints`` the checkpoint
    policy it was deployed with (:func:`controlplane.checkpoints.policy.to_document`;
    None: not checkpointed) and ``restart`` its restart policy
    (:func:`~controlplane.checkpoints.policy.restart_to_document`; None only for a job
    recorded before restart policies were). ``write_anywhere`` says whether its sinks
    were let write outside the job's directory (an admin's submission);
    ``from_savepoint`` the savepoint it started from (``"<job id>/<savepoint id>"``), if
    any; ``delivery`` what each sink guarantees through failures (:func:`delivery_of`).
    With ``job_ref``
    and ``params`` these are what it takes to build the job's graph again
    (:func:`controlplane.jobs.service.rebuild_graph`).
    """

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    job_ref: Mapped[str] = mapped_column(String(500))
    params: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(20), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    version: Mapped[int | None]
    checkpoints: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    restart: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    write_anywhere: Mapped[bool] = mapped_column(default=False, server_default=false())
    from_savepoint: Mapped[str | None] = mapped_column(String(50))
    delivery: Mapped[dict[str, str] | None] = mapped_column(JSON(none_as_null=True))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
