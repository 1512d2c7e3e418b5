"""node inventory: pools made from a cluster's nodes name the resources their nodes advertise

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 06:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("node_pools") as batch:
        batch.add_column(sa.Column("resource_names", sa.JSON(), nullable=False, server_default=sa.text("'{}'")))
        batch.add_column(sa.Column("max_shares_per_pod", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("node_pools") as batch:
        batch.drop_column("max_shares_per_pod")
        batch.drop_column("resource_names")
