"""The ``events`` table: an append-only log of what happened to jobs and the cluster."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import String, Text
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, utcnow

__all__ = ["EVENT_KINDS", "Event"]

EVENT_KINDS = (
    "job.submitted",
    "job.running",
    "job.finished",
    "job.failed",
    "job.stopped",
    "job.recovering",
    "job.recovered",
    "checkpoint.first_completed",
    "checkpoint.abandoned",
    "source.stalled",
    "source.resumed",
    "reconfiguration.completed",
    "reconfiguration.failed",
    "reconfiguration.aborted",
    "reconfiguration.cancelled",
    "worker.registered",
    "worker.lost",
    "worker.stopped",
    "code.uploaded",
    "controller.attached",
    "controller.failed",
    "controller.stopped",
    "controller.started",
)


class Event(Base):
    """One thing that happened; ``job_id`` when it concerns a job (no foreign key: the log
    outlives what it mentions), ``data`` the ids and figures a program needs."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(primary_key=True)
    time: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    kind: Mapped[str] = mapped_column(String(40), index=True)
    job_id: Mapped[int | None] = mapped_column(index=True)
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]]
