"""Migration 0008 adds the nullable `pod_sets.min_replicas` on PostgreSQL and SQLite: pod sets
written before it read back as "every replica required" (NULL), a minimum is stored, and the
downgrade drops the column keeping every workload and pod set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import MetaData, text

from adapters.sql.migrate import alembic_config
from tests.integration.migration_db import database_at, engine_of, filled_row, seed_queue_tree


@pytest.fixture(params=["sqlite", "postgresql"])
def url_at_0007(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database_at("0007", request.param, tmp_path) as url:
        yield url


def test_upgrade_adds_a_nullable_minimum_and_downgrade_drops_it(url_at_0007: str) -> None:
    engine = engine_of(url_at_0007)
    meta = MetaData()
    meta.reflect(engine)
    t = meta.tables
    with engine.begin() as conn:
        seed_queue_tree(conn, t)
        conn.execute(
            t["workloads"].insert(),
            [filled_row(t["workloads"], id="w", name="w", team_id="te", queue_id="qu", priority_class="pc")],
        )
        conn.execute(
            t["pod_sets"].insert(),
            [
                filled_row(t["pod_sets"], workload_id="w", ordinal=i, name=name, gpu_models=[])
                for i, name in enumerate("ab")
            ],
        )

    command.upgrade(alembic_config(url_at_0007), "0008")
    with engine.begin() as conn:
        assert conn.execute(text("SELECT min_replicas FROM pod_sets")).scalars().all() == [None, None]
        conn.execute(text("UPDATE pod_sets SET min_replicas = 2 WHERE name = 'b'"))
        stored = dict(conn.execute(text("SELECT name, min_replicas FROM pod_sets")).all())
    assert stored == {"a": None, "b": 2}

    command.downgrade(alembic_config(url_at_0007), "0007")
    meta = MetaData()
    meta.reflect(engine)
    assert "min_replicas" not in meta.tables["pod_sets"].columns
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM pod_sets")).scalar() == 2  # rows kept
        assert conn.execute(text("SELECT count(*) FROM workloads")).scalar() == 1
    engine.dispose()
