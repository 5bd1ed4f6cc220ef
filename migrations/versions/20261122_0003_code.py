"""Uploaded code: the ``code`` table (modules named ``code:<id>:callable``).

``sqlite_autoincrement``: an id names a module, so SQLite must not hand out the id of a
deleted row again.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "code",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("callables", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_code")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_code_sha256"), "code", ["sha256"])


def downgrade() -> None:
    op.drop_index(op.f("ix_code_sha256"), table_name="code")
    op.drop_table("code")
