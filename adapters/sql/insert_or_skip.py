"""`INSERT ... ON CONFLICT (...) DO NOTHING` on PostgreSQL and SQLite alike.

A conflicting row is skipped in the statement itself, so the write paths that expect one (an inbox
row seen before, an idempotency key used before) need neither a savepoint nor a caught
IntegrityError: one round trip instead of three, and a conflict that does not abort the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session


def insert_or_skip(session: Session, table: Any, conflict_columns: Sequence[str]) -> Any:
    """An insert into `table` that skips a row whose `conflict_columns` (a unique key) exist already.
    Add `.returning(...)` to learn which rows went in."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=list(conflict_columns))
    if dialect == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing(index_elements=list(conflict_columns))
    raise NotImplementedError(f"no INSERT ... ON CONFLICT for {dialect}")
