"""Migration 0008 adds the nullable `pod_sets.min_replicas` on PostgreSQL and SQLite: pod sets
written before it read back as "every replica required" (NULL), a minimum is stored, and the
downgrade drops the column keeping every workload and pod set."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import MetaData, create_engine, text

from adapters.sql.migrate import alembic_config
from tests.conftest import PG_ADMIN_URL
from tests.integration.test_migration_0007 import _engine, _row


@pytest.fixture(params=["sqlite", "postgresql"])
def url_at_0007(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'before-0008.db'}"
        command.upgrade(alembic_config(url), "0007")
        yield url
        return
    name = f"gpufleet_h_minimums_{secrets.token_hex(4)}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    command.upgrade(alembic_config(url), "0007")
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_upgrade_adds_a_nullable_minimum_and_downgrade_drops_it(url_at_0007: str) -> None:
    engine = _engine(url_at_0007)
    meta = MetaData()
    meta.reflect(engine)
    t = meta.tables
    with engine.begin() as conn:
        conn.execute(t["cohorts"].insert(), [_row(t["cohorts"], id="co", name="co")])
        conn.execute(t["teams"].insert(), [_row(t["teams"], id="te", name="te", cohort_id="co")])
        conn.execute(t["queues"].insert(), [_row(t["queues"], id="qu", name="qu", team_id="te")])
        conn.execute(t["priority_classes"].insert(), [_row(t["priority_classes"], name="pc")])
        conn.execute(
            t["workloads"].insert(),
            [_row(t["workloads"], id="w", name="w", team_id="te", queue_id="qu", priority_class="pc")],
        )
        conn.execute(
            t["pod_sets"].insert(),
            [_row(t["pod_sets"], workload_id="w", ordinal=i, name=name, gpu_models=[]) for i, name in enumerate("ab")],
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
