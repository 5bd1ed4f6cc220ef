"""Events and workers: the ``events`` log and the ``workers`` history.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        _timestamp("time"),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    for column in ("job_id", "kind", "time"):
        op.create_index(op.f(f"ix_events_{column}"), "events", [column])

    op.create_table(
        "workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance", sa.String(length=32), nullable=False),
        sa.Column("worker_id", sa.String(length=40), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("cpus", sa.Double(), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=False),
        sa.Column("executor_id", sa.String(length=100), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        _timestamp("registered_at"),
        _timestamp("ended_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
        sa.UniqueConstraint("instance", "worker_id", name=op.f("uq_workers_instance_worker_id")),
    )
    for column in ("instance", "status"):
        op.create_index(op.f(f"ix_workers_{column}"), "workers", [column])


def downgrade() -> None:
    for column in ("instance", "status"):
        op.drop_index(op.f(f"ix_workers_{column}"), table_name="workers")
    op.drop_table("workers")
    for column in ("job_id", "kind", "time"):
        op.drop_index(op.f(f"ix_events_{column}"), table_name="events")
    op.drop_table("events")
