"""The ``reconfigurations`` table: each plan applied (or refused on the way) to a job."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, utcnow
from controlplane.statuses import ReconfigurationStatus

__all__ = ["RECONFIGURATION_STATUSES", "TERMINAL_RECONFIGURATION_STATUSES", "ReconfigurationRecord"]

RECONFIGURATION_STATUSES = tuple(ReconfigurationStatus)
TERMINAL_RECONFIGURATION_STATUSES = frozenset(s for s in ReconfigurationStatus if s.ended)


class ReconfigurationRecord(Base):
    """One reconfiguration of a job: the plan (``base_version``, ops, mode), where it
    came from (``origin``: plan, scale, rebalance, migrate, logic; ``recovery`` for a
    recovery, whose plan says why), how it went (status,
    error, affected tasks, phase timings, per-task pauses and update times in
    milliseconds; in fluid mode how many live runs it took and each stage's time; per
    worker, what it copied ahead and where that time went) and the version it made
    current (``result_version``, once completed).
    ``runtime_id`` is the coordinator's id of the record, once it has one."""

    __tablename__ = "reconfigurations"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    origin: Mapped[str] = mapped_column(String(20))
    plan: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(20), index=True)
    affected_tasks: Mapped[list[str]] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    timings_ms: Mapped[dict[str, Any]]
    pause_ms: Mapped[dict[str, Any]]
    update_ms: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default=text("'{}'"))
    runs: Mapped[int | None]
    stage_ms: Mapped[list[float]] = mapped_column(JSON, default=list, server_default=text("'[]'"))
    precopied: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default=text("'{}'"))
    base_version: Mapped[int]
    result_version: Mapped[int | None]
    runtime_id: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    ended_at: Mapped[datetime | None]
