"""Alembic takes an empty database to head, and the result equals the SQLAlchemy models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from adapters.sql.tables import Base


def _diff(url: str) -> list[object]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    return list(diff)


def test_migrated_postgresql_schema_equals_models(postgresql_database: str) -> None:
    assert _diff(postgresql_database) == []


def test_migrated_sqlite_schema_equals_models(sqlite_database: str) -> None:
    assert _diff(sqlite_database) == []


def test_migrations_create_every_model_table(postgresql_database: str, sqlite_database: str) -> None:
    for url in (postgresql_database, sqlite_database):
        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
        tables = set(inspect(engine).get_table_names()) - {"alembic_version"}
        engine.dispose()
        assert tables == set(Base.metadata.tables)
