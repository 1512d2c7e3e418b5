"""cluster credentials: each cluster agent's NATS credential, stored as a SHA-256 hash

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-03 06:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import adapters.sql.tables

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    utc = adapters.sql.tables.UTCDateTime(timezone=True)
    op.create_table(
        "cluster_credentials",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("cluster_id", sa.String(length=40), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", utc, nullable=False),
        sa.Column("revoked_at", utc, nullable=True),
        sa.ForeignKeyConstraint(["cluster_id"], ["clusters.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("secret_hash"),
    )
    op.create_index("ix_cluster_credentials_cluster_id", "cluster_credentials", ["cluster_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_cluster_credentials_cluster_id", table_name="cluster_credentials")
    op.drop_table("cluster_credentials")
