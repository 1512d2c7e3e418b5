"""node pod summaries: per GPU node, the live pods gpufleet did not place that ask for no GPU (audit)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 19:00:00.000000

A table of its own rather than columns of `nodes`: every write to `nodes` is logged for the
scheduler's snapshot (migration 0009), and an inventory report rewrites these rows every time.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import adapters.sql.tables

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    utc = adapters.sql.tables.UTCDateTime(timezone=True)
    op.create_table(
        "node_pod_summaries",
        sa.Column("cluster_id", sa.String(length=40), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("pods", sa.Integer(), nullable=False),
        sa.Column("sample", sa.JSON(), nullable=False),
        sa.Column("observed_at", utc, nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
            name=op.f("fk_node_pod_summaries_cluster_id_clusters"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("cluster_id", "node", name=op.f("pk_node_pod_summaries")),
    )


def downgrade() -> None:
    op.drop_table("node_pod_summaries")
