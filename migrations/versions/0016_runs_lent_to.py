"""runs.lent_to: the waiting gang whose reserved capacity a run borrowed

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 19:00:00.000000

While a reservation waits for running work to end, the capacity it holds is lent to preemptible
gangs; the gang it is held for takes it back (end cause `taken-back`). The run keeps the id of
that gang so the scheduler knows, cycle after cycle, what may be taken back and by whom. No
foreign key: the owner may be admitted, cancelled or gone, and the mark then means nothing.

The scheduling snapshot reads the column, so an UPDATE of it is logged in `snapshot_changes` like
the other columns it reads (migration 0009): the runs' update trigger is made again with it.
SQLite drops a table's triggers when a batch copies the table (the downgrade), so they are made
again there too.
"""

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

change_cursor = importlib.import_module("migrations.versions.0009_change_cursor")
LOGGED, BEFORE = change_cursor.WATCHED["runs"]
# The columns of `runs` whose UPDATE is logged from this revision on.
RUNS_COLUMNS: tuple[str, ...] = (*BEFORE, "lent_to")


def _runs_triggers(columns: Sequence[str]) -> list[str]:
    if op.get_bind().dialect.name == "postgresql":
        return change_cursor._postgresql("runs", LOGGED, columns)  # noqa: SLF001
    return change_cursor._sqlite("runs", LOGGED, columns)  # noqa: SLF001


def _drop_runs_triggers() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS snapshot_change_runs_write ON runs")
        op.execute("DROP TRIGGER IF EXISTS snapshot_change_runs_update ON runs")
        op.execute("DROP FUNCTION IF EXISTS snapshot_change_runs()")
    else:
        for suffix in ("insert", "delete", "update"):
            op.execute(f"DROP TRIGGER IF EXISTS snapshot_change_runs_{suffix}")


def upgrade() -> None:
    op.add_column("runs", sa.Column("lent_to", sa.String(40), nullable=True))
    _drop_runs_triggers()
    for statement in _runs_triggers(RUNS_COLUMNS):
        op.execute(statement)


def downgrade() -> None:
    _drop_runs_triggers()
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("lent_to")
    for statement in _runs_triggers(BEFORE):
        op.execute(statement)
