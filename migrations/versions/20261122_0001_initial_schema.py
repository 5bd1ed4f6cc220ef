"""Initial schema: jobs, abstraction versions, reconfigurations, tokens.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("job_ref", sa.String(length=500), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("runtime_id", sa.String(length=64), nullable=True),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index(op.f("ix_jobs_runtime_id"), "jobs", ["runtime_id"])
    op.create_index(op.f("ix_jobs_status"), "jobs", ["status"])

    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_tokens_token_hash")),
    )

    op.create_table(
        "reconfigurations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("origin", sa.String(length=20), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("affected_tasks", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("timings_ms", sa.JSON(), nullable=False),
        sa.Column("pause_ms", sa.JSON(), nullable=False),
        sa.Column("base_version", sa.Integer(), nullable=False),
        sa.Column("result_version", sa.Integer(), nullable=True),
        sa.Column("runtime_id", sa.Integer(), nullable=True),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        _timestamp("ended_at", nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_reconfigurations_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reconfigurations")),
    )
    op.create_index(op.f("ix_reconfigurations_job_id"), "reconfigurations", ["job_id"])
    op.create_index(op.f("ix_reconfigurations_status"), "reconfigurations", ["status"])

    op.create_table(
        "abstraction_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.Column("reconfiguration_id", sa.Integer(), nullable=True),
        _timestamp("created_at"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_abstraction_versions_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["reconfiguration_id"],
            ["reconfigurations.id"],
            name=op.f("fk_abstraction_versions_reconfiguration_id_reconfigurations"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_abstraction_versions")),
        sa.UniqueConstraint(
            "job_id", "version", name=op.f("uq_abstraction_versions_job_id_version")
        ),
    )
    op.create_index(op.f("ix_abstraction_versions_job_id"), "abstraction_versions", ["job_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_abstraction_versions_job_id"), table_name="abstraction_versions")
    op.drop_table("abstraction_versions")
    op.drop_index(op.f("ix_reconfigurations_status"), table_name="reconfigurations")
    op.drop_index(op.f("ix_reconfigurations_job_id"), table_name="reconfigurations")
    op.drop_table("reconfigurations")
    op.drop_table("tokens")
    op.drop_index(op.f("ix_jobs_status"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_runtime_id"), table_name="jobs")
    op.drop_table("jobs")
