"""pending reasons: no foreign key; the writer's join on queued workloads is the check

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 16:15:00.000000

A fresh backlog's first cycle inserts a reason for almost every queued gang (97,522 at 100,000).
Each insert's foreign-key check on `workloads` cost 0.43 s of that cycle on PostgreSQL, a second
look-up of the row the writer had just joined to keep only workloads still queued
(adapters/sql/pending_reasons.py). Workloads are never deleted, so the cascade had nothing to do;
a row left behind by a workload deleted by hand is never shown (readers start from `workloads`).
The downgrade removes such rows before it puts the key back.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FOREIGN_KEY = "fk_pending_reasons_workload_id_workloads"


def upgrade() -> None:
    # A batch on SQLite (the table is copied without the key); nothing references this table.
    with op.batch_alter_table("pending_reasons") as batch:
        batch.drop_constraint(FOREIGN_KEY, type_="foreignkey")


def downgrade() -> None:
    op.execute("DELETE FROM pending_reasons WHERE workload_id NOT IN (SELECT id FROM workloads)")
    with op.batch_alter_table("pending_reasons") as batch:
        batch.create_foreign_key(FOREIGN_KEY, "workloads", ["workload_id"], ["id"], ondelete="CASCADE")
