"""change cursor: every write that changes the scheduling snapshot is logged in `snapshot_changes`

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-03 12:20:00.000000

Triggers, not application code, write the log: every writer (ORM flushes, bulk UPDATEs, raw SQL,
foreign-key cascades, a future repository) is covered without being found by hand. A log table
rather than a `change_seq` column per table because deletions (a cancelled cluster's cascade, an
idle finding removed, a run's assignments) leave no row to carry a column; the log keeps their key.
Only the columns the snapshot reads are watched on UPDATE (SNAPSHOT_COLUMNS): the scheduler's own
pending reasons, the dispatcher's dispatch state and the fleet sync's bookkeeping are written
constantly and would otherwise make every refresh re-read everything.

How a reader uses the log safely is in adapters/sql/snapshot_changes.py.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# table -> (what to log: (entity, key column) pairs, columns whose UPDATE is logged; None: any).
# Entities: workload (queued gang and the runs of it), run (live run, its assignments and idle
# finding), fleet (clusters, pools, nodes), tree (cohorts, teams, queues), class (priority classes).
# tests/integration/test_change_cursor.py checks every column of these tables is either watched
# here or deliberately ignored there: a new column the snapshot reads must be added to both.
WATCHED: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...] | None]] = {
    "workloads": (
        (("workload", "id"),),
        (
            "id", "team_id", "queue_id", "name", "priority_class", "priority", "kind",
            "requires_isolation", "min_available", "tolerations", "duration_seconds",
            "max_runtime_seconds", "spot", "same_pool", "state", "created_seq",
        ),
    ),
    "pod_sets": ((("workload", "workload_id"),), None),
    "runs": (
        (("workload", "workload_id"), ("run", "id")),
        ("id", "workload_id", "cluster_id", "state", "end_cause", "created_at", "started_at", "finished_at"),
    ),
    "run_assignments": ((("run", "run_id"),), None),
    "idle_findings": ((("run", "run_id"),), ("run_id", "status", "stage")),
    "clusters": ((("fleet", "id"),), ("id", "name", "provider", "region")),
    "node_pools": (
        (("fleet", "id"),),
        (
            "id", "cluster_id", "name", "gpu_model", "gpus_per_node", "cpu_millis", "memory_mib",
            "sharing", "taints", "labels", "price_per_gpu_hour", "spot", "node_count",
            "resource_names", "max_shares_per_pod",
        ),
    ),
    "nodes": ((("fleet", "id"),), None),
    "cohorts": ((("tree", "id"),), None),
    "teams": ((("tree", "id"),), None),
    "queues": ((("tree", "id"),), None),
    "priority_classes": ((("class", "name"),), None),
}  # fmt: skip

JSON_COLUMNS = frozenset({"tolerations", "taints", "labels", "resource_names"})


def _changed(columns: Sequence[str], dialect: str) -> str:
    def distinct(column: str) -> str:
        if dialect == "postgresql":
            if column in JSON_COLUMNS:  # json has no equality operator; its text is what is stored
                return f"OLD.{column}::text IS DISTINCT FROM NEW.{column}::text"
            return f"OLD.{column} IS DISTINCT FROM NEW.{column}"
        return f"OLD.{column} IS NOT NEW.{column}"

    return " OR ".join(distinct(c) for c in columns)


def _postgresql(table: str, logged: Sequence[tuple[str, str]], columns: Sequence[str] | None) -> list[str]:
    def insert(entity: str, key: str) -> str:
        return (
            "INSERT INTO snapshot_changes (entity, key, txid, at)"  # noqa: S608  (names from WATCHED above)
            f" VALUES ('{entity}', {key}, pg_current_xact_id()::text::bigint, now());"
        )

    body = []
    for entity, column in logged:
        body.append(f"IF TG_OP <> 'DELETE' THEN {insert(entity, 'NEW.' + column)} END IF;")
        body.append(
            f"IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.{column} IS DISTINCT FROM NEW.{column}) THEN"
            f" {insert(entity, 'OLD.' + column)} END IF;"
        )
    function = f"snapshot_change_{table}"
    when = f" WHEN ({_changed(columns, 'postgresql')})" if columns else ""
    return [
        f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {' '.join(body)}"
        " RETURN NULL; END $$",
        f"CREATE TRIGGER {function}_write AFTER INSERT OR DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION {function}()",
        f"CREATE TRIGGER {function}_update AFTER UPDATE ON {table} FOR EACH ROW{when} EXECUTE FUNCTION {function}()",
    ]


def _sqlite(table: str, logged: Sequence[tuple[str, str]], columns: Sequence[str] | None) -> list[str]:
    def insert(entity: str, key: str, condition: str = "") -> str:
        return (
            f"INSERT INTO snapshot_changes (entity, key, at) SELECT '{entity}', {key}, CURRENT_TIMESTAMP"
            f"{' WHERE ' + condition if condition else ''};"
        )

    trigger = f"snapshot_change_{table}"
    inserted = " ".join(insert(entity, "NEW." + column) for entity, column in logged)
    deleted = " ".join(insert(entity, "OLD." + column) for entity, column in logged)
    updated = " ".join(
        insert(entity, "NEW." + column) + " " + insert(entity, "OLD." + column, f"OLD.{column} IS NOT NEW.{column}")
        for entity, column in logged
    )
    when = f" WHEN {_changed(columns, 'sqlite')}" if columns else ""
    return [
        f"CREATE TRIGGER {trigger}_insert AFTER INSERT ON {table} BEGIN {inserted} END",
        f"CREATE TRIGGER {trigger}_delete AFTER DELETE ON {table} BEGIN {deleted} END",
        f"CREATE TRIGGER {trigger}_update AFTER UPDATE ON {table}{when} BEGIN {updated} END",
    ]


def upgrade() -> None:
    op.create_table(
        "snapshot_changes",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("entity", sa.String(length=10), nullable=False),
        sa.Column("key", sa.String(length=253), nullable=False),
        sa.Column("txid", sa.BigInteger(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_snapshot_changes")),
    )
    op.create_index(op.f("ix_snapshot_changes_txid"), "snapshot_changes", ["txid"], unique=False)
    dialect = op.get_bind().dialect.name
    for table, (logged, columns) in WATCHED.items():
        statements = _postgresql(table, logged, columns) if dialect == "postgresql" else _sqlite(table, logged, columns)
        for statement in statements:
            op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for table in WATCHED:
        if dialect == "postgresql":
            op.execute(f"DROP TRIGGER IF EXISTS snapshot_change_{table}_write ON {table}")
            op.execute(f"DROP TRIGGER IF EXISTS snapshot_change_{table}_update ON {table}")
            op.execute(f"DROP FUNCTION IF EXISTS snapshot_change_{table}()")
        else:
            for suffix in ("insert", "delete", "update"):
                op.execute(f"DROP TRIGGER IF EXISTS snapshot_change_{table}_{suffix}")
    op.drop_index(op.f("ix_snapshot_changes_txid"), table_name="snapshot_changes")
    op.drop_table("snapshot_changes")
