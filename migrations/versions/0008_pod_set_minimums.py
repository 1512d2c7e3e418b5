"""pod-set minimums: the fewest replicas a pod set may start with (partial admission, issue 12)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 12:30:00.000000

A nullable column: NULL (every existing row) means every replica is required, as before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("pod_sets", sa.Column("min_replicas", sa.Integer(), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), as in 0007, not a batch copy of the table.
    op.drop_column("pod_sets", "min_replicas")
