"""Savepoints: the ``checkpoints`` table records savepoints too (``kind``: ``checkpoint``,
or ``savepoint`` for one taken on request and kept until deleted; ``checkpoint`` for the
rows already there), and ``jobs`` says which savepoint a job was submitted from
(``from_savepoint``, ``"<job id>/<savepoint id>"``; null for the jobs already there) and
what each of its sinks guarantees through failures (``delivery``: sink -> "exactly-once",
"at-least-once" or "none"; null for the jobs already there).

Both tables are altered in place (no batch table copy: on SQLite, whose foreign keys are
on, a copy of ``jobs`` would cascade-delete every job's versions, reconfigurations and
checkpoints).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "checkpoints",
        sa.Column("kind", sa.String(length=20), server_default="checkpoint", nullable=False),
    )
    op.create_index(op.f("ix_checkpoints_kind"), "checkpoints", ["kind"])
    op.add_column("jobs", sa.Column("from_savepoint", sa.String(length=50), nullable=True))
    op.add_column("jobs", sa.Column("delivery", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "delivery")
    op.drop_column("jobs", "from_savepoint")
    op.drop_index(op.f("ix_checkpoints_kind"), table_name="checkpoints")
    op.drop_column("checkpoints", "kind")
