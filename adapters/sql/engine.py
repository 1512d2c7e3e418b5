"""Engines for PostgreSQL (production) and SQLite (the embedded default)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str, **kwargs: Any) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            # Let SQLAlchemy, not pysqlite, emit BEGIN, so savepoints and BEGIN IMMEDIATE work.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            # FULL: a commit is on disk before the API answers 201 or a consumer acks, so an
            # acknowledged submission survives power loss. (WAL with NORMAL only survives an
            # application crash: the last commits can be rolled back by a power cut.)
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            # SQLite has one writer: take the write lock up front instead of failing to upgrade.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False, autoflush=True)
