"""Migration 0016 adds `runs.lent_to` (the waiting gang whose reserved capacity a run borrowed):
runs written before it read as not lent, on PostgreSQL and SQLite; the downgrade drops the column
and keeps every run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, text

from adapters.sql.engine import make_engine
from adapters.sql.migrate import alembic_config
from tests.integration.migration_db import database_at, filled_row, reflected, seed_queue_tree, workload_row


@pytest.fixture(params=["sqlite", "postgresql"])
def url_at_0015(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database_at("0015", request.param, tmp_path) as url:
        yield url


def _seed(engine: Engine) -> None:
    t = reflected(engine)
    with engine.begin() as conn:
        seed_queue_tree(conn, t)
        conn.execute(t["clusters"].insert(), [filled_row(t["clusters"], id="c1", name="c1")])
        conn.execute(t["workloads"].insert(), [workload_row(t["workloads"], "w-a", state="running")])
        conn.execute(
            t["runs"].insert(),
            [filled_row(t["runs"], id="run-a-1", workload_id="w-a", cluster_id="c1", attempt=1, state="running")],
        )


def _runs(engine: Engine, columns: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(f"SELECT {columns} FROM runs ORDER BY id"))]


def _logged_after(engine: Engine, statement: str) -> bool:
    """Whether `statement` (an UPDATE of the run) wrote to the change log (migration 0009)."""
    with engine.begin() as conn:
        before = conn.execute(text("SELECT count(*) FROM snapshot_changes")).scalar()
        conn.execute(text(statement))
        return bool(conn.execute(text("SELECT count(*) FROM snapshot_changes")).scalar() != before)


def test_upgrade_reads_old_runs_as_not_lent_and_downgrade_keeps_every_run(url_at_0015: str) -> None:
    engine = make_engine(url_at_0015)
    _seed(engine)
    config = alembic_config(url_at_0015)
    try:
        command.upgrade(config, "0016")
        assert _runs(engine, "id, lent_to") == [("run-a-1", None)]
        # The snapshot reads the column: its update is logged; a column it does not read is not.
        assert _logged_after(engine, "UPDATE runs SET lent_to = 'w-big' WHERE id = 'run-a-1'")
        assert not _logged_after(engine, "UPDATE runs SET message = 'hello' WHERE id = 'run-a-1'")
        assert _logged_after(engine, "UPDATE runs SET state = 'dispatching' WHERE id = 'run-a-1'")
        assert _runs(engine, "id, lent_to") == [("run-a-1", "w-big")]

        command.downgrade(config, "0015")
        engine.dispose()
        assert "lent_to" not in reflected(engine)["runs"].columns
        assert _runs(engine, "id, state") == [("run-a-1", "dispatching")]
        # The runs' triggers are back as 0009 made them (SQLite's batch copy dropped them).
        assert _logged_after(engine, "UPDATE runs SET state = 'running' WHERE id = 'run-a-1'")
        assert not _logged_after(engine, "UPDATE runs SET message = 'again' WHERE id = 'run-a-1'")
    finally:
        engine.dispose()
