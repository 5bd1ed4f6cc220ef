"""The ``code`` table: one row per uploaded module (its source is kept verbatim)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String, Text
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, utcnow

__all__ = ["CodeModule"]


class CodeModule(Base):
    """An uploaded module. Its id names it (``code:<id>:callable``), so ids are never
    reused, not even on SQLite after a rollback (``sqlite_autoincrement``)."""

    __tablename__ = "code"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    filename: Mapped[str] = mapped_column(String(255))
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    source: Mapped[str] = mapped_column(Text)
    callables: Mapped[list[str]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
