"""Checkpoints: the ``checkpoints`` table (each checkpoint of a job, as the coordinator
reported it), and on ``jobs`` the policies each job was deployed with (``checkpoints``,
``restart``) and whether its sinks may write anywhere (``write_anywhere``, false for the
jobs already there).

``jobs`` is altered in place (SQLite 3.35+ drops a column in place): a batch table copy
would cascade-delete every job's versions, reconfigurations and checkpoints on SQLite,
whose foreign keys are on.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("checkpoints", sa.JSON(none_as_null=True), nullable=True))
    op.add_column("jobs", sa.Column("restart", sa.JSON(none_as_null=True), nullable=True))
    op.add_column(
        "jobs",
        sa.Column("write_anywhere", sa.Boolean(), server_default=sa.false(), nullable=False),
    )

    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("checkpoint_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("full_bytes", sa.BigInteger(), nullable=False),
        sa.Column("tasks", sa.Integer(), nullable=False),
        _timestamp("started_at"),
        sa.Column("duration_ms", sa.Double(), nullable=True),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_checkpoints_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint(
            "job_id", "checkpoint_id", name=op.f("uq_checkpoints_job_id_checkpoint_id")
        ),
    )
    op.create_index(op.f("ix_checkpoints_job_id"), "checkpoints", ["job_id"])
    op.create_index(op.f("ix_checkpoints_status"), "checkpoints", ["status"])


def downgrade() -> None:
    op.drop_index(op.f("ix_checkpoints_status"), table_name="checkpoints")
    op.drop_index(op.f("ix_checkpoints_job_id"), table_name="checkpoints")
    op.drop_table("checkpoints")
    op.drop_column("jobs", "write_anywhere")
    op.drop_column("jobs", "restart")
    op.drop_column("jobs", "checkpoints")
