"""serving signals: an inference workload's declared traffic/latency metrics and their latest reading

Revision ID: 0011
Revises: 0009
Create Date: 2026-12-03 18:40:00.000000

`workloads.serving` holds the declared block (NULL for every existing row: nothing declared);
`serving_readings` one row per run, the newest reading its cluster's agent reported. Nothing here
depends on revision 0010's tables.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from adapters.sql.tables import UTCDateTime

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("workloads", sa.Column("serving", sa.JSON(none_as_null=True), nullable=True))
    op.create_table(
        "serving_readings",
        sa.Column("run_id", sa.String(40), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("cluster", sa.String(63), nullable=False),
        sa.Column("observed_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("requests_per_second", sa.Float(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("updated_at", UTCDateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("serving_readings")
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), as in 0007 and 0008.
    op.drop_column("workloads", "serving")
