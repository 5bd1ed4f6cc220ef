"""The ``checkpoints`` table: each checkpoint of a job, as the coordinator reported it."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, utcnow

__all__ = ["CheckpointRecord"]


class CheckpointRecord(Base):
    """Checkpoint ``checkpoint_id`` of job ``job_id``: the coordinator's id for it (its
    barrier id, growing within the job), its ``kind`` (``checkpoint``, taken by the
    policy's timer; ``savepoint``, taken on request and kept until deleted), the
    abstraction ``version`` the job ran, how it
    went (``status``, ``error``), where its manifest is (``path``), what its tasks wrote
    for it (``bytes``, incremental) and what the state it restores comes to
    (``full_bytes``), how many ``tasks`` took part, when it started and how long it took.
    One row per checkpoint, updated as its reports come (see
    :func:`controlplane.checkpoints.service.record`)."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "checkpoint_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    checkpoint_id: Mapped[int]
    kind: Mapped[str] = mapped_column(String(20), index=True, server_default="checkpoint")
    version: Mapped[int | None]
    status: Mapped[str] = mapped_column(String(20), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    path: Mapped[str | None] = mapped_column(Text)
    bytes: Mapped[int] = mapped_column(BigInteger)
    full_bytes: Mapped[int] = mapped_column(BigInteger)
    tasks: Mapped[int]
    started_at: Mapped[datetime]
    duration_ms: Mapped[float | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
