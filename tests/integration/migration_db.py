"""A throwaway database migrated to a given revision, on SQLite or PostgreSQL, for migration tests
(each upgrades it past its own migration, checks the data, and downgrades again)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic import command
from sqlalchemy import JSON, Boolean, Connection, DateTime, Engine, Float, Integer, MetaData, Table, create_engine, text

from adapters.sql.migrate import alembic_config
from tests.conftest import PG_ADMIN_URL

NOW = datetime(2026, 12, 1, tzinfo=UTC)


@contextmanager
def database_at(revision: str, backend: str, tmp_path: Path) -> Iterator[str]:
    """The URL of a new database at `revision` ("sqlite" or "postgresql"); dropped afterwards."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / f'at-{revision}.db'}"
        command.upgrade(alembic_config(url), revision)
        yield url
        return
    name = f"migration_at_{revision}_{secrets.token_hex(4)}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        command.upgrade(alembic_config(url), revision)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def engine_of(url: str) -> Engine:
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://"))


def filled_row(table: Any, **given: object) -> dict[str, object]:
    """`given`, plus a plain value for every other NOT NULL column without a default."""
    row = dict(given)
    for column in table.columns:
        if column.name in row or column.nullable or column.server_default is not None or column.autoincrement is True:
            continue
        kind = column.type
        if isinstance(kind, DateTime):
            row[column.name] = NOW
        elif isinstance(kind, Boolean):
            row[column.name] = False
        elif isinstance(kind, (Integer, Float)):
            row[column.name] = 1
        elif isinstance(kind, JSON):
            row[column.name] = {}
        else:
            row[column.name] = f"{column.name}-x"[: getattr(kind, "length", None) or 40]
    return row


def seed_queue_tree(conn: Connection, t: dict[str, Table]) -> None:
    """Cohort `co`, team `te`, queue `qu` and priority class `pc`: what a workload row points at."""
    conn.execute(t["cohorts"].insert(), [filled_row(t["cohorts"], id="co", name="co")])
    conn.execute(t["teams"].insert(), [filled_row(t["teams"], id="te", name="te", cohort_id="co")])
    conn.execute(t["queues"].insert(), [filled_row(t["queues"], id="qu", name="qu", team_id="te")])
    conn.execute(t["priority_classes"].insert(), [filled_row(t["priority_classes"], name="pc")])


def reflected(engine: Engine) -> dict[str, Table]:
    """The database's tables as it stands (at whatever revision the test put it)."""
    meta = MetaData()
    meta.reflect(engine)
    return dict(meta.tables)


def workload_row(table: Table, workload_id: str, seq: int = 0, **given: object) -> dict[str, object]:
    """A `workloads` row of queue `qu` (team `te`, class `pc`: `seed_queue_tree`), named as its id."""
    return filled_row(
        table,
        id=workload_id,
        name=workload_id,
        team_id="te",
        queue_id="qu",
        priority_class="pc",
        created_seq=seq,
        idempotency_key=None,
        **given,
    )
