"""Controllers: ``controllers``, ``controller_decisions``, ``controller_logs``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _owner(table: str) -> tuple[sa.Column, sa.ForeignKeyConstraint]:
    return (
        sa.Column("controller_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["controller_id"],
            ["controllers.id"],
            name=op.f(f"fk_{table}_controller_id_controllers"),
            ondelete="CASCADE",
        ),
    )


def upgrade() -> None:
    op.create_table(
        "controllers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("builtin", sa.String(length=100), nullable=True),
        sa.Column("filename", sa.String(length=255), nullable=True),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("class_name", sa.String(length=200), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("safety", sa.JSON(), nullable=False),
        sa.Column("interval_s", sa.Double(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("decisions_without_plan", sa.Integer(), nullable=False),
        _timestamp("last_decision_at", nullable=True),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_controllers_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_controllers")),
    )
    op.create_index(op.f("ix_controllers_job_id"), "controllers", ["job_id"])
    op.create_index(op.f("ix_controllers_status"), "controllers", ["status"])

    column, owner = _owner("controller_decisions")
    op.create_table(
        "controller_decisions",
        sa.Column("id", sa.Integer(), nullable=False),
        column,
        _timestamp("time"),
        sa.Column("view", sa.JSON(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("applied", sa.Boolean(), nullable=False),
        sa.Column("moves", sa.Integer(), nullable=False),
        sa.Column("reconfiguration_id", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        _timestamp("ended_at", nullable=True),
        owner,
        sa.ForeignKeyConstraint(
            ["reconfiguration_id"],
            ["reconfigurations.id"],
            name=op.f("fk_controller_decisions_reconfiguration_id_reconfigurations"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_controller_decisions")),
    )
    op.create_index(
        op.f("ix_controller_decisions_controller_id"), "controller_decisions", ["controller_id"]
    )

    column, owner = _owner("controller_logs")
    op.create_table(
        "controller_logs",
        sa.Column("id", sa.Integer(), nullable=False),
        column,
        _timestamp("time"),
        sa.Column("source", sa.String(length=10), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        owner,
        sa.PrimaryKeyConstraint("id", name=op.f("pk_controller_logs")),
    )
    op.create_index(op.f("ix_controller_logs_controller_id"), "controller_logs", ["controller_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_controller_logs_controller_id"), table_name="controller_logs")
    op.drop_table("controller_logs")
    op.drop_index(op.f("ix_controller_decisions_controller_id"), table_name="controller_decisions")
    op.drop_table("controller_decisions")
    op.drop_index(op.f("ix_controllers_status"), table_name="controllers")
    op.drop_index(op.f("ix_controllers_job_id"), table_name="controllers")
    op.drop_table("controllers")
