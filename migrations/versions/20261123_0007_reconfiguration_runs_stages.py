"""Reconfigurations keep how many live runs they took (``runs``) and each stage's time
(``stage_ms``, fluid mode).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("reconfigurations") as batch:
        batch.add_column(sa.Column("runs", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("stage_ms", sa.JSON(), nullable=False, server_default=sa.text("'[]'"))
        )


def downgrade() -> None:
    with op.batch_alter_table("reconfigurations") as batch:
        batch.drop_column("stage_ms")
        batch.drop_column("runs")
