"""The ``tokens`` table: bearer tokens, stored as the SHA-256 of the secret."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, utcnow

__all__ = ["Token"]


class Token(Base):
    """A bearer token: ``token_hash`` is the hex SHA-256 of the secret (the secret itself
    is shown once, when the token is created); ``scopes`` lists read / operate / admin."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
