"""The ``abstraction_versions`` table: every version of every job's abstraction, kept."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, utcnow

__all__ = ["AbstractionVersion"]


class AbstractionVersion(Base):
    """Version ``version`` of job ``job_id``'s abstraction: the JSON document of
    :meth:`controlplane.abstraction.Abstraction.to_dict`, and the reconfiguration that
    made it (None for version 1, made by the submission)."""

    __tablename__ = "abstraction_versions"
    __table_args__ = (UniqueConstraint("job_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    version: Mapped[int]
    document: Mapped[dict[str, Any]]
    reconfiguration_id: Mapped[int | None] = mapped_column(
        ForeignKey("reconfigurations.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
