"""The SLO gauges read from SQL at scrape time: effective utilization per run and per team, GPUs held
by unmeasured runs, queue waits, and serving signals against their objectives.

Bounded like the rest of `gauges_repo`: per-run answers are cut to `limit` rows in the query (the
lowest utilization first, so the runs worth looking at are the ones kept); per-queue and per-team
answers follow what was registered. The team figures run the utilization report's own accounting
(`controlplane.service.reports.aggregate_sums`) over the last hour, so `/metrics` and `gpufleet report`
cannot disagree.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from sqlalchemy import Float, String, and_, case, cast, func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from adapters.sql.report_repo import SqlReportRepository
from adapters.sql.serving_repo import SqlServingRepository
from adapters.sql.tables import (
    ClusterRow,
    NodeRow,
    QueueRow,
    RunAssignmentRow,
    RunRow,
    TeamRow,
    TelemetryWindowRow,
    WorkloadRow,
)
from controlplane.core.gpu_eq import gpu_eq_float
from controlplane.domain.model import NodePool
from controlplane.service.metrics import QueueWaits, RunServing, RunUtilization, TeamUtilization
from controlplane.service.report_accounting import DEFAULT_IDLE_THRESHOLD
from controlplane.service.reports import GroupBy, aggregate_sums

LIVE_RUN_STATES = ("admitted", "dispatching", "running")
TEAM_PERIOD = timedelta(hours=1)
# The safety cap of a grouped query (as in gauges_repo).
MAX_ROWS = 20_000


def activity_terms() -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    """(sum, samples) of a window's activity signal as the idle policy reads it: SM activity, else
    graphics-engine activity, else GPU utilization, chosen per window row."""
    w = TelemetryWindowRow
    total = func.sum(
        case((w.sm_active_n > 0, w.sm_active_sum), (w.gr_engine_n > 0, w.gr_engine_sum), else_=w.gpu_util_sum)
    )
    samples = func.sum(case((w.sm_active_n > 0, w.sm_active_n), (w.gr_engine_n > 0, w.gr_engine_n), else_=w.gpu_util_n))
    return total, samples


def demand_of(text: Any) -> dict[str, int]:
    """A run assignment's demand read back from its JSON column (text when grouped on)."""
    value = json.loads(text) if isinstance(text, str) else text
    if not isinstance(value, Mapping):
        return {}
    return {str(k): int(v) for k, v in value.items() if isinstance(v, int | float)}


def run_utilization(s: Session, now: datetime, lookback: timedelta, limit: int) -> tuple[RunUtilization, ...]:
    """Live runs with a telemetry window in `lookback`: the activity mean over the GPUs of their
    latest window, lowest first, at most `limit`."""
    if limit <= 0:
        return ()
    w = TelemetryWindowRow
    latest = (
        select(w.run_id.label("run_id"), func.max(w.window_start).label("start"))
        .where(w.window_start >= now - lookback, w.run_id != "")
        .group_by(w.run_id)
        .subquery()
    )
    total, samples = activity_terms()
    ratio = cast(total, Float) / cast(samples, Float)
    rows = s.execute(
        select(RunRow.id, WorkloadRow.name, TeamRow.name, QueueRow.name, ClusterRow.name, ratio)
        .join(latest, latest.c.run_id == RunRow.id)
        .join(w, and_(w.run_id == RunRow.id, w.window_start == latest.c.start))
        .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
        .join(TeamRow, TeamRow.id == WorkloadRow.team_id)
        .join(QueueRow, QueueRow.id == WorkloadRow.queue_id)
        .join(ClusterRow, ClusterRow.id == RunRow.cluster_id)
        .where(RunRow.state.in_(LIVE_RUN_STATES))
        .group_by(RunRow.id, WorkloadRow.name, TeamRow.name, QueueRow.name, ClusterRow.name)
        .having(samples > 0)
        .order_by(ratio, RunRow.id)
        .limit(limit)
    )
    return tuple(
        RunUtilization(run, workload, team, queue, cluster, float(value or 0.0))
        for run, workload, team, queue, cluster, value in rows
    )


def team_utilization(s: Session, now: datetime, allocated: Mapping[str, float]) -> tuple[TeamUtilization, ...]:
    """Per team over the last hour: the utilization report's figures; `allocated` (team -> gpu-eq
    held now) is added, and a team holding GPUs with no run in the hour still gets a row."""
    start = now - TEAM_PERIOD
    reports = SqlReportRepository(s)
    runs = reports.runs(start, now, None)
    sums = reports.window_sums([(start, now)], None, now, DEFAULT_IDLE_THRESHOLD) if runs else []
    report = aggregate_sums(runs, sums, start, now, GroupBy.TEAM, now, top=0)
    by_team = {row.group: row for row in report.groups}
    out = []
    for team in sorted(set(by_team) | set(allocated)):
        row = by_team.get(team)
        out.append(
            TeamUtilization(
                team=team,
                allocated_gpu_hours=row.allocated_gpu_hours if row else 0.0,
                measured_gpu_hours=row.measured_gpu_hours if row else 0.0,
                used_gpu_hours=row.used_gpu_hours if row else 0.0,
                efficiency=row.efficiency if row else None,
                allocated_gpus=float(allocated.get(team, 0.0)),
            )
        )
    return tuple(out)


def unmeasured_gpus(
    s: Session, clusters: Mapping[str, str], pools: Mapping[str, NodePool], now: datetime, lookback: timedelta
) -> dict[str, float]:
    """Per cluster name: gpu-eq held by running runs that have no telemetry window in `lookback`
    (admitted or dispatching runs have no pods to measure yet and are left out)."""
    w = TelemetryWindowRow
    measured = select(w.run_id).where(w.window_start >= now - lookback, w.run_id != "").distinct()
    shape = cast(RunAssignmentRow.demand, String)
    rows = s.execute(
        select(NodeRow.pool_id, shape, func.count())
        .select_from(RunAssignmentRow)
        .join(RunRow, RunRow.id == RunAssignmentRow.run_id)
        .join(NodeRow, NodeRow.id == RunAssignmentRow.node_id)
        .where(RunRow.state == "running", RunRow.id.not_in(measured))
        .group_by(NodeRow.pool_id, shape)
        .limit(MAX_ROWS)
    )
    out: dict[str, Fraction] = defaultdict(Fraction)
    for pool_id, demand_text, count in rows:
        pool = pools.get(pool_id)
        if pool is None or pool.cluster_id not in clusters:
            continue
        out[clusters[pool.cluster_id]] += Fraction(gpu_eq_float(demand_of(demand_text), pool)) * int(count)
    # Every registered cluster gets a value, 0 included: an alert compares, it does not test absence.
    return {name: float(out.get(name, 0)) for name in sorted(clusters.values())}


def _nearest_rank(s: Session, queue_id: str, count: int, q: float) -> datetime | None:
    """The submit time of the queued workload whose wait is the q-quantile (nearest rank) of the
    queue's current waits: waits ascending are submit times descending."""
    rank = max(1, math.ceil(q * count))
    return s.scalar(
        select(WorkloadRow.created_at)
        .where(WorkloadRow.state == "queued", WorkloadRow.queue_id == queue_id)
        .order_by(WorkloadRow.created_at.desc(), WorkloadRow.id)
        .offset(rank - 1)
        .limit(1)
    )


def queue_waits(
    s: Session,
    queues: Mapping[str, tuple[str, str]],
    teams: Mapping[str, str],
    now: datetime,
    percentiles: bool = True,
) -> tuple[QueueWaits, ...]:
    """Per registered queue: queued workloads, the age of the oldest, and p50/p95 of the current
    waits (seconds since submission). Two indexed lookups per queue with anything queued; none
    without `percentiles` (then p50 and p95 are 0)."""
    counts = {
        queue_id: (int(n), oldest)
        for queue_id, n, oldest in s.execute(
            select(WorkloadRow.queue_id, func.count(), func.min(WorkloadRow.created_at))
            .where(WorkloadRow.state == "queued")
            .group_by(WorkloadRow.queue_id)
        )
    }
    out = []
    for queue_id, (name, team_id) in sorted(queues.items(), key=lambda item: item[1][0]):
        n, oldest = counts.get(queue_id, (0, None))
        waits = QueueWaits(name, teams.get(team_id, ""), n, 0.0, 0.0, 0.0)
        if n and not percentiles:
            waits = QueueWaits(name, waits.team, n, _age(_aware(oldest, now), now), 0.0, 0.0)
        elif n:
            waits = QueueWaits(
                name,
                waits.team,
                n,
                _age(_aware(oldest, now), now),
                _age(_nearest_rank(s, queue_id, n, 0.5), now),
                _age(_nearest_rank(s, queue_id, n, 0.95), now),
            )
        out.append(waits)
    return tuple(out)


def _age(when: datetime | None, now: datetime) -> float:
    return 0.0 if when is None else max(0.0, (now - when).total_seconds())


def _aware(value: Any, now: datetime) -> datetime | None:
    """SQLite hands back aggregates as naive text, without the column type's UTC conversion."""
    if value is None:
        return None
    stamp: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=now.tzinfo)


def serving(s: Session, limit: int) -> tuple[RunServing, ...]:
    """Live inference runs with a serving reading: the slowest against their objective first (then
    the slowest), at most `limit`."""
    if limit <= 0:
        return ()
    signals = [x for x in SqlServingRepository(s).signals(MAX_ROWS) if x.observed_at is not None]

    def badness(x: Any) -> tuple[float, float, str]:
        latency = x.latency_ms or 0.0
        ratio = latency / x.latency_objective_ms if x.latency_objective_ms else 0.0
        return (-ratio, -latency, x.run_id)

    return tuple(
        RunServing(x.run_id, x.workload, x.team, x.cluster, x.requests_per_second, x.latency_ms, x.latency_objective_ms)
        for x in sorted(signals, key=badness)[:limit]
    )
