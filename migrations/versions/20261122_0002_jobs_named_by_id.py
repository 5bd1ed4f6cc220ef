"""Jobs are deployed under their own id: drop ``jobs.runtime_id``.

The control plane now names each deployed job after its row (``controlplane.engine.job_key``),
so the coordinator's id is derived, not stored. Plain ALTERs (SQLite 3.35+ drops a column
in place): a batch table copy would cascade-delete the job's versions and
reconfigurations on SQLite, whose foreign keys are on.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index(op.f("ix_jobs_runtime_id"), table_name="jobs")
    op.drop_column("jobs", "runtime_id")


def downgrade() -> None:
    op.add_column("jobs", sa.Column("runtime_id", sa.String(length=64), nullable=True))
    op.execute("UPDATE jobs SET runtime_id = CAST(id AS VARCHAR(64))")
    op.create_index(op.f("ix_jobs_runtime_id"), "jobs", ["runtime_id"])
