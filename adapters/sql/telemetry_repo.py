"""Telemetry windows in SQL: one multi-row upsert per consumer batch, on PostgreSQL and SQLite.

The upsert and the inbox insert go to the driver's executemany with plain tuples, bypassing
SQLAlchemy's per-row parameter processing: at tens of thousands of window rows per second that
processing cost more than the database did. Values are converted with the columns' own bind
processors, so what lands on disk is what the ORM would have written.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any, cast

from sqlalchemy import Table, delete, select
from sqlalchemy.orm import Session

from adapters.sql.tables import InboxRow, TelemetryWindowRow
from controlplane.service.telemetry import WINDOW_COUNTERS, WINDOW_MAXIMA
from controlplane.service.telemetry_window import TelemetryWindow, WindowQuery

WINDOWS = cast(Table, TelemetryWindowRow.__table__)
INBOX = cast(Table, InboxRow.__table__)
_FIELDS = TelemetryWindow._fields
_COLUMNS = (*_FIELDS, "updated_at")
_TIME_FIELDS = tuple(
    i for i, name in enumerate(_FIELDS) if name in ("window_start", "first_sample_at", "last_sample_at", "xid_at")
)
_RUN = _FIELDS.index("run_id")
_KEY = itemgetter(_RUN, _FIELDS.index("gpu_key"), _FIELDS.index("window_start"))
# Far below SQLite's limit on bound parameters per statement (32766 since 3.32).
_IN_CHUNK = 900


@functools.cache
def _upsert_sql(dialect: str, placeholder: str) -> str:
    if dialect == "postgresql":
        larger, smaller = "greatest", "least"
    elif dialect == "sqlite":
        # SQLite's two-argument max()/min() are scalar; its dates are ISO text, so they compare.
        larger, smaller = "max", "min"
    else:
        raise RuntimeError(f"telemetry upsert is not implemented for {dialect}")
    t = "telemetry_windows"
    newer_xid = (
        f"excluded.xid_at IS NOT NULL AND ({t}.xid_at IS NULL OR excluded.xid_at > {t}.xid_at"
        f" OR (excluded.xid_at = {t}.xid_at AND excluded.xid_last > {t}.xid_last))"
    )
    sets = [f"{c} = {t}.{c} + excluded.{c}" for c in WINDOW_COUNTERS]
    sets += [f"{c} = {larger}({t}.{c}, excluded.{c})" for c in WINDOW_MAXIMA]
    sets += [
        f"first_sample_at = {smaller}({t}.first_sample_at, excluded.first_sample_at)",
        f"last_sample_at = {larger}({t}.last_sample_at, excluded.last_sample_at)",
        f"xid_last = CASE WHEN {newer_xid} THEN excluded.xid_last ELSE {t}.xid_last END",
        f"xid_at = CASE WHEN {newer_xid} THEN excluded.xid_at ELSE {t}.xid_at END",
        "updated_at = excluded.updated_at",
    ]
    # Identity columns (node, pod, MIG profile...) keep what the first batch wrote. The text is
    # made of fixed column names only; every value is a bound parameter.
    return (
        f"INSERT INTO {t} ({', '.join(_COLUMNS)}) VALUES ({', '.join([placeholder] * len(_COLUMNS))})"  # noqa: S608
        f" ON CONFLICT (run_id, gpu_key, window_start) DO UPDATE SET {', '.join(sets)}"
    )


class SqlTelemetryRepository:
    def __init__(self, session: Session) -> None:
        self.s = session

    def _driver(self) -> tuple[str, str, Callable[[Any], Any]]:
        dialect = self.s.get_bind().dialect
        placeholder = "?" if dialect.paramstyle == "qmark" else "%s"
        # The dialect-level processor: UTCDateTime's conversion, then the driver format (on SQLite
        # the exact text the ORM writes, so comparisons with ORM-bound values hold).
        to_db = WINDOWS.c.window_start.type.dialect_impl(dialect).bind_processor(dialect) or (lambda value: value)
        return dialect.name, placeholder, to_db

    def claim_batches(self, consumer: str, msg_ids: Sequence[str], now: datetime) -> set[str]:
        wanted = list(dict.fromkeys(msg_ids))
        seen: set[str] = set()
        for i in range(0, len(wanted), _IN_CHUNK):
            chunk = wanted[i : i + _IN_CHUNK]
            query = select(InboxRow.msg_id).where(InboxRow.consumer == consumer, InboxRow.msg_id.in_(chunk))
            seen.update(self.s.scalars(query))
        fresh = [m for m in wanted if m not in seen]
        if fresh:
            _, ph, to_db = self._driver()
            stamp = to_db(now)
            # A plain INSERT: if another consumer claims one of these ids meanwhile, the unique key
            # fails this whole transaction and every message is redelivered, then seen as duplicate.
            self.s.connection().exec_driver_sql(
                f"INSERT INTO inbox (consumer, msg_id, processed_at) VALUES ({ph}, {ph}, {ph})",  # noqa: S608
                [(consumer, m, stamp) for m in fresh],
            )
        return set(fresh)

    def merge_windows(self, windows: Sequence[TelemetryWindow], now: datetime) -> None:
        if not windows:
            return
        dialect, ph, to_db = self._driver()
        # Windows of one batch share their datetime objects (one per scrape and window start), so
        # each is converted once, looked up by identity: the objects outlive this call.
        converted: dict[int, Any] = {}

        def stamp(value: datetime | None) -> Any:
            if value is None:
                return None
            out = converted.get(id(value))
            if out is None:
                out = converted[id(value)] = to_db(value)
            return out

        keep = [now]  # referenced, so its id cannot be reused by a temporary while we convert
        updated = stamp(keep[0])
        rows: list[tuple[Any, ...]] = []
        for w in windows:
            row: list[Any] = list(w)
            row[_RUN] = w.run_id or ""  # primary keys hold no NULL: "" is "no run"
            for i in _TIME_FIELDS:
                row[i] = stamp(row[i])
            row.append(updated)
            rows.append(tuple(row))
        # Key order: concurrent consumers lock rows in the same order and cannot deadlock.
        rows.sort(key=_KEY)
        # executemany of one statement: sqlite3 loops in C, psycopg pipelines it. (Multi-row VALUES
        # statements were measured slower on both: psycopg spends ~15 us per parameter adapting them.)
        self.s.connection().exec_driver_sql(_upsert_sql(dialect, ph), rows)

    def windows(self, query: WindowQuery) -> list[TelemetryWindow]:
        c = WINDOWS.c
        stmt = select(*(c[name] for name in _FIELDS))
        if query.unattributed:
            stmt = stmt.where(c.run_id == "")
        elif query.run_id is not None:
            stmt = stmt.where(c.run_id == query.run_id)
        if query.cluster is not None:
            stmt = stmt.where(c.cluster == query.cluster)
        if query.node is not None:
            stmt = stmt.where(c.node == query.node)
        if query.since is not None:
            stmt = stmt.where(c.window_start >= query.since)
        if query.until is not None:
            stmt = stmt.where(c.window_start < query.until)
        stmt = stmt.order_by(c.window_start, c.gpu_key, c.run_id).limit(query.limit)
        return [TelemetryWindow(*row)._replace(run_id=row[_RUN] or None) for row in self.s.execute(stmt)]

    def prune(self, windows_before: datetime, consumer: str, inbox_before: datetime) -> tuple[int, int]:
        gone = self.s.execute(delete(TelemetryWindowRow).where(TelemetryWindowRow.window_start < windows_before))
        inbox = self.s.execute(
            delete(InboxRow).where(InboxRow.consumer == consumer, InboxRow.processed_at < inbox_before)
        )
        return int(gone.rowcount), int(inbox.rowcount)  # type: ignore[attr-defined]
