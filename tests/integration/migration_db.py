"""A throwaway database migrated to a given revision, on SQLite or PostgreSQL, for migration tests
(each upgrades it past its own migration, checks the data, and downgrades again)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from sqlalchemy import Engine, create_engine, text

from adapters.sql.migrate import alembic_config
from tests.conftest import PG_ADMIN_URL


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
