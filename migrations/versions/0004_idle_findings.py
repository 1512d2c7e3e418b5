"""idle findings: the idle policy's verdict and evidence per live run

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 18:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import adapters.sql.tables

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    utc = adapters.sql.tables.UTCDateTime(timezone=True)
    op.create_table(
        "idle_findings",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("workload_id", sa.String(length=40), nullable=False),
        sa.Column("cluster", sa.String(length=63), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("stage", sa.String(length=20), nullable=False),
        sa.Column("idle_windows", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("action", sa.String(length=20), nullable=False),
        sa.Column("stage_since", utc, nullable=False),
        sa.Column("updated_at", utc, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id"),
    )
    op.create_index("ix_idle_findings_workload_id", "idle_findings", ["workload_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_idle_findings_workload_id", table_name="idle_findings")
    op.drop_table("idle_findings")
