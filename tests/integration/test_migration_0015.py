"""Migration 0015 drops the foreign key of `pending_reasons` (the writer's join on queued workloads
is the check), keeping every row, on PostgreSQL and SQLite; its downgrade removes the rows whose
workload is gone and puts the key back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, inspect, select, text
from sqlalchemy.engine.interfaces import ReflectedForeignKeyConstraint
from sqlalchemy.exc import IntegrityError

from adapters.sql.engine import make_engine
from adapters.sql.migrate import alembic_config
from tests.integration.migration_db import database_at, reflected, seed_queue_tree, workload_row


@pytest.fixture(params=["sqlite", "postgresql"])
def url_at_0014(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database_at("0014", request.param, tmp_path) as url:
        yield url


def _seed(engine: Engine) -> None:
    t = reflected(engine)
    with engine.begin() as conn:
        seed_queue_tree(conn, t)
        conn.execute(
            t["workloads"].insert(),
            [workload_row(t["workloads"], wid, seq, state="queued") for seq, wid in enumerate(("w-a", "w-b"))],
        )
        reasons: list[dict[str, object]] = [
            {"workload_id": w, "reason": f"no-fit: {w}", "kind": "no-fit", "detail": {}} for w in ("w-a", "w-b")
        ]
        conn.execute(t["pending_reasons"].insert(), reasons)


def _rows(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return {row[0]: row[1] for row in conn.execute(text("SELECT workload_id, reason FROM pending_reasons"))}


def _foreign_keys(engine: Engine) -> list[ReflectedForeignKeyConstraint]:
    # A new connection: SQLite's foreign_key_list pragma answers from a connection's cached schema,
    # which a pooled connection opened before the migration still holds.
    engine.dispose()
    return inspect(engine).get_foreign_keys("pending_reasons")


def _orphan(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO pending_reasons (workload_id, reason, kind) VALUES ('w-gone', 'no-fit: gone', 'no-fit')")
        )


def test_upgrade_drops_the_key_and_downgrade_restores_it_without_the_rows_it_forbids(url_at_0014: str) -> None:
    engine = make_engine(url_at_0014)  # on SQLite with foreign keys enforced, as migrations run
    _seed(engine)
    config = alembic_config(url_at_0014)
    try:
        with pytest.raises(IntegrityError):
            _orphan(engine)  # 0014 checks every row
        command.upgrade(config, "0015")
        assert _foreign_keys(engine) == []
        assert _rows(engine) == {"w-a": "no-fit: w-a", "w-b": "no-fit: w-b"}
        _orphan(engine)  # unchecked now: the scheduler's writer joins queued workloads instead
        assert set(_rows(engine)) == {"w-a", "w-b", "w-gone"}

        command.downgrade(config, "0014")
        [key] = _foreign_keys(engine)
        assert (key["referred_table"], key["constrained_columns"]) == ("workloads", ["workload_id"])
        assert _rows(engine) == {"w-a": "no-fit: w-a", "w-b": "no-fit: w-b"}
        with pytest.raises(IntegrityError):
            _orphan(engine)
        with engine.connect() as conn:
            assert conn.execute(select(text("count(*)")).select_from(text("workloads"))).scalar() == 2
        command.upgrade(config, "head")  # and up again
    finally:
        engine.dispose()
