"""Tables of controllers: ``controllers``, ``controller_decisions``, ``controller_logs``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, utcnow
from controlplane.statuses import ControllerStatus, DecisionStatus

__all__ = [
    "CONTROLLER_STATUSES",
    "DECISION_STATUSES",
    "ControllerDecision",
    "ControllerLog",
    "ControllerRecord",
]

CONTROLLER_STATUSES = tuple(ControllerStatus)
DECISION_STATUSES = tuple(DecisionStatus)


class ControllerRecord(Base):
    """A controller attached to one job: an uploaded script (``source``) or a built-in
    (``builtin``), with its config and safety limits, and its lifecycle as last seen."""

    __tablename__ = "controllers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    builtin: Mapped[str | None] = mapped_column(String(100))
    filename: Mapped[str | None] = mapped_column(String(255))
    source: Mapped[str | None] = mapped_column(Text)
    class_name: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict[str, Any]]
    safety: Mapped[dict[str, Any]]
    interval_s: Mapped[float]
    status: Mapped[str] = mapped_column(String(20), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    restarts: Mapped[int] = mapped_column(default=0)
    failures: Mapped[int] = mapped_column(default=0)
    decisions_without_plan: Mapped[int] = mapped_column(default=0)
    last_decision_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class ControllerDecision(Base):
    """A plan a controller returned, and what became of it."""

    __tablename__ = "controller_decisions"

    id: Mapped[int] = mapped_column(primary_key=True)
    controller_id: Mapped[int] = mapped_column(
        ForeignKey("controllers.id", ondelete="CASCADE"), index=True
    )
    time: Mapped[datetime] = mapped_column(default=utcnow)
    view: Mapped[dict[str, Any]]
    plan: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(20))
    applied: Mapped[bool]
    moves: Mapped[int] = mapped_column(default=0)
    reconfiguration_id: Mapped[int | None] = mapped_column(
        ForeignKey("reconfigurations.id", ondelete="SET NULL")
    )
    error: Mapped[str | None] = mapped_column(Text)
    ended_at: Mapped[datetime | None]


class ControllerLog(Base):
    """One line a controller printed, or the host wrote about it."""

    __tablename__ = "controller_logs"

    id: Mapped[int] = mapped_column(primary_key=True)
    controller_id: Mapped[int] = mapped_column(
        ForeignKey("controllers.id", ondelete="CASCADE"), index=True
    )
    time: Mapped[datetime] = mapped_column(default=utcnow)
    source: Mapped[str] = mapped_column(String(10))  # "script" (its output) or "host"
    message: Mapped[str] = mapped_column(Text)
