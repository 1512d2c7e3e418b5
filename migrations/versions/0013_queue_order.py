"""queue order: positions are worked out where they are read; an index for the queue's order

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 07:00:00.000000

The scheduler stored each waiting gang's queue position with its reason, so every cycle that
admitted anything rewrote every row behind it. Positions are now read from the queue's order
(priority, then submission sequence) with this index; the column goes.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_workloads_queue_order", "workloads", ["queue_id", "state", "priority", "created_seq"], unique=False
    )
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), not a batch copy: recreating `workloads`
    # on SQLite, where foreign keys are enforced, would cascade-delete every run and pod set.
    op.drop_column("workloads", "queue_position")


def downgrade() -> None:
    op.add_column("workloads", sa.Column("queue_position", sa.Integer(), nullable=True))
    op.drop_index("ix_workloads_queue_order", table_name="workloads")
