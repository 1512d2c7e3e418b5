"""Telemetry windows summed in the database, per report bucket, run, node and MIG profile.

A report over a day of a busy fleet covers tens of thousands of windows; reading them all into
Python cost more than a second. This query returns one row per (bucket, run, node, MIG profile)
with the windows' overlap seconds already summed, following exactly the rule of
`controlplane.service.report_accounting.window_sums` (the tests hold the two equal):

- a window counts in bucket `[lo, hi)` when it starts in `[lo - WINDOW_LOOKBACK, hi)`, belongs to a
  run (of the team, if one is asked) and has an activity reading (SM active, else graphics engine
  active, else GPU utilization);
- it counts for its overlap with `[max(lo, admission), min(hi, now, the run's end))`, if positive.

Times are compared as integer microseconds since the epoch, so the clipping is exact on both
backends: PostgreSQL's `extract(epoch ...)` is an exact numeric; SQLite stores the ORM's text
`YYYY-MM-DD HH:MM:SS.ffffff`, read as whole seconds plus the six digits (SQLite's own date
functions round fractions to milliseconds). The buckets come from a recursive CTE (equal steps from
the first start, the last cut at the end), which both backends run.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Float, Integer, and_, case, cast, extract, func, literal, select
from sqlalchemy.orm import Session

from adapters.sql.tables import RunRow, TelemetryWindowRow, WorkloadRow
from controlplane.service.report_records import WINDOW_LOOKBACK, WindowSum

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROS = 1_000_000
US = timedelta(microseconds=1)


def _micros(value: datetime) -> int:
    return (value - EPOCH) // US


def _column_micros(dialect: str, column: Any) -> ColumnElement[int]:
    """A timestamp column as integer microseconds since the epoch (exact)."""
    if dialect == "postgresql":
        return cast(extract("epoch", column) * MICROS, BigInteger)
    if dialect == "sqlite":
        whole = cast(func.strftime("%s", func.substr(column, 1, 19)), BigInteger)
        return whole * MICROS + cast(func.substr(column, 21, 6), BigInteger)
    raise RuntimeError(f"window sums are not implemented for {dialect}")


def equal_steps(spans: Sequence[tuple[datetime, datetime]]) -> timedelta:
    """The step of consecutive buckets of one length (the last may be shorter); ValueError if not."""
    step = spans[0][1] - spans[0][0]
    for i, (lo, hi) in enumerate(spans):
        last = i == len(spans) - 1
        if step <= timedelta(0) or lo != spans[0][0] + i * step or hi <= lo or (hi - lo != step and not last):
            raise ValueError("window sums need consecutive buckets of one length (the last may be shorter)")
    if spans[-1][1] - spans[-1][0] > step:
        raise ValueError("the last bucket is longer than the others")
    return step


def window_sums(
    s: Session,
    spans: Sequence[tuple[datetime, datetime]],
    team_id: str | None,
    now: datetime,
    idle_threshold: float,
) -> list[WindowSum]:
    if not spans:
        return []
    step = equal_steps(spans)
    dialect = s.get_bind().dialect.name
    larger, smaller = (func.greatest, func.least) if dialect == "postgresql" else (func.max, func.min)
    w = TelemetryWindowRow
    start, end = spans[0][0], spans[-1][1]

    def micros(value: int) -> ColumnElement[int]:
        return cast(literal(value, BigInteger), BigInteger)

    seed = select(cast(literal(0, Integer), Integer).label("bucket"), micros(_micros(start)).label("lo"))
    recursive = seed.cte("buckets", recursive=True)
    buckets = recursive.union_all(
        select(recursive.c.bucket + 1, recursive.c.lo + micros(step // US)).where(recursive.c.bucket + 1 < len(spans))
    )
    bucket_hi = smaller(buckets.c.lo + micros(step // US), micros(_micros(end)))
    stop = smaller(bucket_hi, micros(_micros(now)))

    # First the windows of the range that share a run, node, MIG profile and time (a node's GPUs
    # report together), summed; then their times as integers. Materialized, so the bucket join
    # below compares integers instead of converting times once per bucket.
    activity = case(  # the window's activity mean from its best signal (TelemetryWindow.activity_mean)
        (w.sm_active_n > 0, cast(w.sm_active_sum, Float) / w.sm_active_n),
        (w.gr_engine_n > 0, cast(w.gr_engine_sum, Float) / w.gr_engine_n),
        (w.gpu_util_n > 0, cast(w.gpu_util_sum, Float) / w.gpu_util_n),
        else_=None,
    )
    same_time = (w.run_id, w.node, w.mig_profile, w.window_start, w.window_seconds)
    alike = select(
        *same_time,
        func.count().label("windows"),
        func.sum(activity).label("activity"),
        func.sum(case((activity < idle_threshold, 1), else_=0)).label("idle"),
    ).where(w.window_start >= start - WINDOW_LOOKBACK, w.window_start < end, activity.is_not(None))
    if team_id is not None:
        alike = alike.join(RunRow, RunRow.id == w.run_id).join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
        alike = alike.where(WorkloadRow.team_id == team_id)
    a = alike.group_by(*same_time).subquery("alike")
    start_us = _column_micros(dialect, a.c.window_start)
    windows = (
        select(
            a.c.run_id,
            a.c.node,
            a.c.mig_profile,
            a.c.windows,
            a.c.activity,
            a.c.idle,
            start_us.label("start_us"),
            (start_us + cast(a.c.window_seconds, BigInteger) * MICROS).label("end_us"),
            _column_micros(dialect, RunRow.created_at).label("admitted_us"),
            _column_micros(dialect, RunRow.finished_at).label("finished_us"),
        )
        .join(RunRow, RunRow.id == a.c.run_id)
        .cte("windows")
        .prefix_with("MATERIALIZED")
    )

    begin = larger(windows.c.start_us, buckets.c.lo, windows.c.admitted_us)
    finish = smaller(windows.c.end_us, stop, func.coalesce(windows.c.finished_us, stop))
    p = (
        select(
            buckets.c.bucket,
            windows.c.run_id,
            windows.c.node,
            windows.c.mig_profile,
            (finish - begin).label("span"),
            windows.c.windows,
            windows.c.activity,
            windows.c.idle,
        )
        .select_from(windows)
        .join(
            buckets,
            and_(
                windows.c.start_us >= buckets.c.lo - WINDOW_LOOKBACK // US,
                windows.c.start_us < bucket_hi,
                buckets.c.lo < windows.c.end_us,
            ),
        )
        .subquery("pieces")
    )
    query = (
        select(
            p.c.bucket,
            p.c.run_id,
            p.c.node,
            p.c.mig_profile,
            # Integer sums cast back: PostgreSQL sums BIGINT as NUMERIC, which arrives as Decimal.
            cast(func.sum(p.c.span * p.c.windows), BigInteger),
            cast(func.sum(p.c.span * p.c.activity), Float),
            cast(func.sum(p.c.span * p.c.idle), BigInteger),
        )
        .where(p.c.span > 0)
        .group_by(p.c.bucket, p.c.run_id, p.c.node, p.c.mig_profile)
    )
    return [
        WindowSum(bucket, run_id, node, profile, measured / MICROS, used / MICROS, idle / MICROS)
        for bucket, run_id, node, profile, measured, used, idle in s.execute(query)
    ]
