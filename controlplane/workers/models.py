"""The ``workers`` table: every worker that registered, per control-plane run, as last seen.

Worker ids (``w1``, ``w2``...) are given by the coordinator of one run, so a row is
named by the run (``instance``) and the id. The coordinator's registry stays the truth for
live workers; this table keeps their history, and why each one was lost.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, utcnow

__all__ = ["WorkerRecord"]


class WorkerRecord(Base):
    __tablename__ = "workers"
    __table_args__ = (UniqueConstraint("instance", "worker_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    instance: Mapped[str] = mapped_column(String(32), index=True)
    worker_id: Mapped[str] = mapped_column(String(40))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int]
    cpus: Mapped[float]
    memory_mb: Mapped[int]
    executor_id: Mapped[str | None] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(20), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None]
