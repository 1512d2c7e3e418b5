"""Migration 0009 adds the snapshot change log and its triggers on PostgreSQL and SQLite, and its
downgrade removes both (a write then logs nothing and fails on nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, inspect, text

from adapters.sql.migrate import alembic_config
from tests.integration.migration_db import database_at, engine_of


@pytest.fixture(params=["sqlite", "postgresql"])
def url_at_0007(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database_at("0007", request.param, tmp_path) as url:
        yield url


def _write_fleet(engine: Engine, name: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO clusters (id, name, provider, region, created_at, account, cloud_cluster,"
                " resource_group, cloud_cluster_id, kube_settings, kubeconfig_ref, sync_state, sync_error,"
                " pool_issues, pool_prices) VALUES (:id, :id, 'sim', '', :at, '', '', '', '', '{}', '', 'ready', '',"
                " '[]', '{}')"
            ),
            {"id": name, "at": "2026-12-03 12:00:00"},
        )
        conn.execute(text("UPDATE clusters SET sync_state = 'error' WHERE id = :id"), {"id": name})  # not watched
        conn.execute(text("UPDATE clusters SET region = 'eu' WHERE id = :id"), {"id": name})
        conn.execute(text("DELETE FROM clusters WHERE id = :id"), {"id": name})


def test_upgrade_logs_watched_writes_and_downgrade_removes_the_log(url_at_0007: str) -> None:
    config = alembic_config(url_at_0007)
    command.upgrade(config, "0009")
    engine = engine_of(url_at_0007)
    try:
        _write_fleet(engine, "c1")
        with engine.connect() as conn:
            logged = conn.execute(text("SELECT entity, key FROM snapshot_changes ORDER BY seq")).all()
        assert logged == [("fleet", "c1")] * 3  # insert, the watched update, delete; not the sync state
        command.downgrade(config, "0007")
        assert "snapshot_changes" not in inspect(engine).get_table_names()
        _write_fleet(engine, "c2")  # no trigger is left behind to write into a missing table
        command.upgrade(config, "0009")
    finally:
        engine.dispose()
