"""typed decisions: a run's end cause and a pending reason's kind are columns, not message prefixes

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 09:15:00.000000

Existing rows are backfilled from the message prefixes the code wrote until now; this is the
only place those prefixes are ever read back.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (message prefix, end cause) of runs ended as `preempted`, most specific first.
PREEMPTED_CAUSES = (
    ("reclaimed-idle:", "reclaimed-idle"),
    ("rebalanced:", "rebalanced"),
    ("reclaimed:", "reclaimed"),
    ("node-lost:", "node-lost"),
    ("gang-start-timeout:", "gang-start-timeout"),
    ("dispatch-timeout:", "dispatch-timeout"),
)
# (reason prefix, pending kind) of queued workloads, most specific first.
PENDING_KINDS = (
    ("no-fit:", "no-fit"),
    ("fair-share:", "fair-share"),
    ("isolation:", "isolation"),
    ("quota: unusable", "quota-unusable"),
    ("quota: non-preemptible", "quota-guarantee"),
    ("quota: the rest of the free", "quota-not-lent"),
    ("quota: % may borrow at most", "quota-borrowing"),
    ("quota: % limit is", "quota-limit"),
    ("error: not considered", "not-considered"),
    ("error:", "error"),
)


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("end_cause", sa.String(length=20), nullable=False, server_default=""))
        batch.create_index("ix_runs_end_cause", ["end_cause"], unique=False)
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("reason_kind", sa.String(length=30), nullable=False, server_default=""))
        batch.add_column(sa.Column("reason_detail", sa.JSON(), nullable=True))

    runs = sa.table("runs", sa.column("state", sa.String), sa.column("message", sa.Text), sa.column("end_cause"))
    preempted = [(runs.c.message.like(f"{prefix}%"), cause) for prefix, cause in PREEMPTED_CAUSES]
    op.execute(
        runs.update().values(
            end_cause=sa.case(
                *[(sa.and_(runs.c.state == "preempted", match), cause) for match, cause in preempted],
                (runs.c.state == "preempted", "preempted"),
                (sa.and_(runs.c.state == "failed", runs.c.message.like("cannot dispatch to %")), "dispatch-failed"),
                (runs.c.state.in_(("failed", "succeeded", "cancelled")), runs.c.state),
                else_="",
            )
        )
    )
    workloads = sa.table(
        "workloads", sa.column("state", sa.String), sa.column("reason", sa.Text), sa.column("reason_kind")
    )
    op.execute(
        workloads.update()
        .where(workloads.c.state == "queued")
        .values(
            reason_kind=sa.case(
                *[(workloads.c.reason.like(f"{prefix}%"), kind) for prefix, kind in PENDING_KINDS], else_=""
            )
        )
    )


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), not a batch copy: recreating `workloads`
    # on SQLite, where foreign keys are enforced, would cascade-delete every run and pod set.
    op.drop_index("ix_runs_end_cause", table_name="runs")
    op.drop_column("runs", "end_cause")
    op.drop_column("workloads", "reason_detail")
    op.drop_column("workloads", "reason_kind")
