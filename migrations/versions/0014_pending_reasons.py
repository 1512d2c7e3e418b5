"""pending reasons: the scheduler's reasons for queued gangs move to a narrow table

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 14:00:00.000000

A deep backlog's first cycle writes a reason for almost every queued gang (97,522 at 100,000).
Written into the wide `workloads` rows that UPDATE is not HOT (every index of the table is
rewritten): 2–4 s of the cycle on PostgreSQL. `pending_reasons` holds them now (one row per queued
gang the scheduler has decided on); `workloads.reason` keeps the text of the last transition
(submit, cancel, eviction, admission, failure), and `reason_kind` and `reason_detail` go. The
reasons of queued gangs that have a kind move over; a queued gang without one was not decided on
since it was queued, and keeps its own reason.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pending_reasons",
        sa.Column("workload_id", sa.String(length=40), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=30), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("workload_id"),
    )
    op.execute(
        "INSERT INTO pending_reasons (workload_id, reason, kind, detail)"
        " SELECT id, reason, reason_kind, reason_detail FROM workloads"
        " WHERE state = 'queued' AND reason_kind <> ''"
    )
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), not a batch copy: recreating `workloads`
    # on SQLite, where foreign keys are enforced, would cascade-delete every run, pod set and
    # pending reason (and drop the change log's triggers on it).
    op.drop_column("workloads", "reason_detail")
    op.drop_column("workloads", "reason_kind")


def downgrade() -> None:
    op.add_column("workloads", sa.Column("reason_kind", sa.String(length=30), nullable=False, server_default=""))
    op.add_column("workloads", sa.Column("reason_detail", sa.JSON(), nullable=True))
    # The pending reason was also the workload's reason before 0014; only a queued workload's
    # row is shown (a row left for a finished one is stale).
    op.execute(
        "UPDATE workloads SET reason = p.reason, reason_kind = p.kind, reason_detail = p.detail"
        " FROM pending_reasons AS p WHERE p.workload_id = workloads.id AND workloads.state = 'queued'"
    )
    op.drop_table("pending_reasons")
