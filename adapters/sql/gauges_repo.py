"""The fleet gauges operators watch, read from SQL with a few bounded aggregate queries.

Every query groups in the database and returns at most one row per (queue, kind), (cluster, pool,
demand shape) or similar: the row count follows what was registered, not the number of workloads,
runs or telemetry windows. Prometheus calls this when it scrapes (the adapter caches the answer for a
few seconds, so scraping faster than that costs nothing).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from sqlalchemy import Engine, String, and_, cast, func, select
from sqlalchemy.orm import Session

from adapters.sql import pool_gauges, slo_gauges
from adapters.sql.convert import pool_from_row
from adapters.sql.pool_gauges import LIVE_RUN_STATES, MAX_ROWS, NOTIFIED_STAGES
from adapters.sql.slo_gauges import activity_terms, demand_of
from adapters.sql.tables import (
    ClusterRow,
    IdleFindingRow,
    LeaderLeaseRow,
    NodePoolRow,
    NodeRow,
    OutboxRow,
    PendingReasonRow,
    QueueRow,
    RunAssignmentRow,
    RunRow,
    TeamRow,
    TelemetryWindowRow,
    WorkloadRow,
)
from controlplane.core.gpu_eq import gpu_eq_float
from controlplane.domain.model import NodePool
from controlplane.service.metrics import (
    DEFAULT_MAX_RUN_SERIES,
    ClusterGpus,
    FleetGauges,
    LeaseState,
    QueueQuota,
    TeamUtilization,
    pending_reason_kind,
)

UNFINISHED_STATES = ("queued", "admitted", "dispatching", "running")
GPU_EQ = "gpu-eq"


class SqlFleetGauges:
    """`FleetGaugeReader` over the SQL store. `activity_lookback` bounds the telemetry windows read;
    `max_run_series` the runs of the per-run families; the team figures (an hour of windows through
    the report's accounting) are recomputed at most every `team_interval`. With `slo=False` (the
    dashboard's and `GET /v1/status`'s reader) the SLO families are left empty and queue waits carry
    no percentiles: those reads are most of a gauge read's cost on a large fleet (`gpufleet bench
    dashboard`), and no page shows them."""

    def __init__(
        self,
        engine: Engine,
        activity_lookback: timedelta = timedelta(minutes=15),
        max_run_series: int = DEFAULT_MAX_RUN_SERIES,
        # An hour's figures move slowly, and computing them reads every window of the hour (6 s on
        # SQLite for 64,000 windows in `gpufleet dev bench metrics`): at most once per five minutes.
        team_interval: timedelta = timedelta(minutes=5),
        slo: bool = True,
        # The per-pool figures, live runs per cluster and pending demand: the dashboard and
        # `GET /v1/status` read them, Prometheus exports none (its scrapes leave them out).
        pools: bool = True,
    ) -> None:
        self.engine = engine
        self.slo = slo
        self.pools = pools
        self.activity_lookback = activity_lookback
        self.max_run_series = max_run_series
        self.team_interval = team_interval
        self._teams: tuple[datetime, tuple[TeamUtilization, ...]] | None = None

    def read(self, now: datetime) -> FleetGauges:
        with Session(self.engine) as s, s.begin():
            queues = {
                row.id: (row.name, row.team_id)
                for row in s.execute(select(QueueRow.id, QueueRow.name, QueueRow.team_id))
            }
            teams: dict[str, str] = dict(s.execute(select(TeamRow.id, TeamRow.name)).all())
            clusters: dict[str, tuple[str, str]] = {
                cid: (name, state)
                for cid, name, state in s.execute(select(ClusterRow.id, ClusterRow.name, ClusterRow.sync_state))
            }
            pools = {row.id: pool_from_row(row) for row in s.scalars(select(NodePoolRow))}
            pending = self._pending(s, queues)
            workloads = self._workloads(s, queues)
            used, allocated, idle_gpus, notified = self._live_usage(s, queues, teams, pools)
            quotas = tuple(
                QueueQuota(
                    queue=name,
                    team=teams.get(team_id, ""),
                    used=used.get(queue_id, {}),
                    guaranteed=_amounts(guaranteed),
                    limit=_amounts(limit),
                )
                for queue_id, name, team_id, guaranteed, limit in s.execute(
                    select(QueueRow.id, QueueRow.name, QueueRow.team_id, QueueRow.guaranteed, QueueRow.limit)
                )
            )
            gpus = self._gpus(s, clusters, pools, allocated)
            findings = self._findings(s, teams)
            activity, measured = self._activity(s, clusters, now)
            backlog, oldest = s.execute(
                select(func.count(), func.min(OutboxRow.created_at)).where(OutboxRow.published_at.is_(None))
            ).one()
            leases = tuple(
                LeaseState(name, int(epoch), (expires - now).total_seconds())
                for name, epoch, expires in s.execute(
                    select(LeaderLeaseRow.name, LeaderLeaseRow.epoch, LeaderLeaseRow.expires_at)
                )
            )
            cluster_names = {cid: name for cid, (name, _) in clusters.items()}
            held_by_team: dict[str, float] = defaultdict(float)
            for queue_id, amounts in used.items():
                held_by_team[teams.get(queues[queue_id][1], "")] += amounts.get(GPU_EQ, 0.0)
            if self.slo:
                runs = slo_gauges.run_utilization(s, now, self.activity_lookback, self.max_run_series)
                team_figures = self._team_figures(s, now, held_by_team)
                unmeasured = slo_gauges.unmeasured_gpus(s, cluster_names, pools, now, self.activity_lookback)
                waits = slo_gauges.queue_waits(s, queues, teams, now)
                serving = slo_gauges.serving(s, self.max_run_series)
            else:
                runs, team_figures, unmeasured, serving = (), (), {}, ()
                waits = slo_gauges.queue_waits(s, queues, teams, now, percentiles=False)
            by_pool, demand, live_runs = (
                (
                    pool_gauges.pool_gpus(s, cluster_names, pools, now, self.activity_lookback),
                    pool_gauges.pending_demand(s),
                    pool_gauges.cluster_runs(s, cluster_names),
                )
                if self.pools
                else ((), (), {})
            )
        return FleetGauges(
            pending=pending,
            workloads=workloads,
            quotas=quotas,
            gpus=gpus,
            idle_findings=findings,
            idle_gpus=idle_gpus,
            sm_active=activity,
            measured_gpus=measured,
            cluster_sync_errors={name: int(state == "error") for name, state in clusters.values()},
            outbox_backlog=int(backlog),
            outbox_oldest_seconds=max(0.0, (now - _aware(oldest, now)).total_seconds()) if oldest else 0.0,
            leases=leases,
            run_utilization=runs,
            team_utilization=team_figures,
            idle_notified_gpus={(cluster_names.get(c, c), t): v for (c, t), v in notified.items()},
            unmeasured_gpus=unmeasured,
            queue_waits=waits,
            serving=serving,
            pools=by_pool,
            pending_demand=demand,
            cluster_runs=live_runs,
        )

    def _team_figures(self, s: Session, now: datetime, held: Mapping[str, float]) -> tuple[TeamUtilization, ...]:
        """The hour's figures per team, kept `team_interval`; the GPUs held now are always fresh."""
        if self._teams is None or not timedelta(0) <= now - self._teams[0] < self.team_interval:
            self._teams = (now, slo_gauges.team_utilization(s, now, {}))
        cached = {t.team: t for t in self._teams[1]}
        out = []
        for team in sorted(set(cached) | set(held)):
            row = cached.get(team) or TeamUtilization(team, 0.0, 0.0, 0.0, None, 0.0)
            out.append(replace(row, allocated_gpus=float(held.get(team, 0.0))))
        return tuple(out)

    @staticmethod
    def _pending(s: Session, queues: Mapping[str, tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Queued gangs by queue and the kind of their pending reason (`pending_reasons.kind`;
        none, "": not decided on since it was queued)."""
        rows = s.execute(
            select(WorkloadRow.queue_id, PendingReasonRow.kind, func.count())
            .outerjoin(PendingReasonRow, PendingReasonRow.workload_id == WorkloadRow.id)
            .where(WorkloadRow.state == "queued")
            .group_by(WorkloadRow.queue_id, PendingReasonRow.kind)
            .limit(MAX_ROWS)
        )
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for queue_id, kind, count in rows:
            counts[(queues.get(queue_id, ("", ""))[0], pending_reason_kind(kind or ""))] += int(count)
        return dict(counts)

    @staticmethod
    def _workloads(s: Session, queues: Mapping[str, tuple[str, str]]) -> dict[tuple[str, str], int]:
        rows = s.execute(
            select(WorkloadRow.queue_id, WorkloadRow.state, func.count())
            .where(WorkloadRow.state.in_(UNFINISHED_STATES))
            .group_by(WorkloadRow.queue_id, WorkloadRow.state)
        )
        return {(queues.get(q, ("", ""))[0], state): int(n) for q, state, n in rows}

    @staticmethod
    def _live_usage(
        s: Session, queues: Mapping[str, tuple[str, str]], teams: Mapping[str, str], pools: Mapping[str, NodePool]
    ) -> tuple[
        dict[str, dict[str, float]],
        dict[tuple[str, str], Fraction],
        dict[tuple[str, str], float],
        dict[tuple[str, str], float],
    ]:
        """GPU-equivalents held by live runs: per queue and resource, per (cluster id, GPU model), per
        (idle stage, team), and per (cluster id, team) for runs at an idle stage of notify or beyond.
        Grouped by demand shape (as text), so one row stands for many pods."""
        shape = cast(RunAssignmentRow.demand, String)
        stage = func.coalesce(IdleFindingRow.stage, "")
        rows = s.execute(
            select(WorkloadRow.queue_id, WorkloadRow.team_id, stage, NodeRow.pool_id, shape, func.count())
            .select_from(RunAssignmentRow)
            .join(RunRow, RunRow.id == RunAssignmentRow.run_id)
            .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
            .join(NodeRow, NodeRow.id == RunAssignmentRow.node_id)
            .outerjoin(IdleFindingRow, IdleFindingRow.run_id == RunRow.id)
            .where(RunRow.state.in_(LIVE_RUN_STATES))
            .group_by(WorkloadRow.queue_id, WorkloadRow.team_id, stage, NodeRow.pool_id, shape)
            .limit(MAX_ROWS)
        )
        used: dict[str, dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
        allocated: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
        idle: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
        notified: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
        for queue_id, team_id, idle_stage, pool_id, demand_text, count in rows:
            pool = pools.get(pool_id)
            if pool is None:
                continue
            demand = demand_of(demand_text)
            amount = Fraction(gpu_eq_float(demand, pool)) * int(count)
            if not amount:
                continue
            used[queue_id][GPU_EQ] += amount
            used[queue_id][pool.gpu_model] += amount
            allocated[(pool.cluster_id, pool.gpu_model)] += amount
            if idle_stage:
                idle[(idle_stage, teams.get(team_id, ""))] += amount
            if idle_stage in NOTIFIED_STAGES:
                notified[(pool.cluster_id, teams.get(team_id, ""))] += amount
        return (
            {q: {k: float(v) for k, v in amounts.items()} for q, amounts in used.items() if q in queues},
            dict(allocated),
            {key: float(v) for key, v in idle.items()},
            {key: float(v) for key, v in notified.items()},
        )

    @staticmethod
    def _gpus(
        s: Session,
        clusters: Mapping[str, tuple[str, str]],
        pools: Mapping[str, NodePool],
        allocated: Mapping[tuple[str, str], Fraction],
    ) -> tuple[ClusterGpus, ...]:
        capacity: dict[tuple[str, str], int] = defaultdict(int)
        rows = s.execute(
            select(NodeRow.pool_id, func.count()).where(NodeRow.schedulable.is_(True)).group_by(NodeRow.pool_id)
        )
        for pool_id, nodes in rows:
            pool = pools.get(pool_id)
            if pool is not None:
                capacity[(pool.cluster_id, pool.gpu_model)] += pool.gpus_per_node * int(nodes)
        keys = sorted(set(capacity) | set(allocated))
        return tuple(
            ClusterGpus(clusters[c][0], model, float(capacity.get((c, model), 0)), float(allocated.get((c, model), 0)))
            for c, model in keys
            if c in clusters
        )

    @staticmethod
    def _findings(s: Session, teams: Mapping[str, str]) -> dict[tuple[str, str], int]:
        rows = s.execute(
            select(IdleFindingRow.stage, WorkloadRow.team_id, func.count())
            .join(RunRow, RunRow.id == IdleFindingRow.run_id)
            .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
            .where(RunRow.state.in_(LIVE_RUN_STATES))
            .group_by(IdleFindingRow.stage, WorkloadRow.team_id)
        )
        return {(stage, teams.get(team_id, "")): int(n) for stage, team_id, n in rows}

    def _activity(
        self, s: Session, clusters: Mapping[str, tuple[str, str]], now: datetime
    ) -> tuple[dict[str, float], dict[str, int]]:
        """Mean DCGM activity of GPUs held by runs over the recent windows, per cluster: SM activity,
        else graphics-engine activity, else GPU utilization, per window, as the idle policy reads it."""
        w = TelemetryWindowRow
        total, samples = activity_terms()
        rows = s.execute(
            select(w.cluster, total, samples, func.count(func.distinct(w.gpu_key)))
            .where(and_(w.window_start >= now - self.activity_lookback, w.run_id != ""))
            .group_by(w.cluster)
            .limit(MAX_ROWS)
        )
        names = {name for name, _ in clusters.values()}
        activity: dict[str, float] = {}
        measured: dict[str, int] = {}
        for cluster, summed, n, gpus in rows:
            if cluster not in names:
                continue  # only registered clusters are label values
            measured[cluster] = int(gpus)
            if n:
                activity[cluster] = float(summed or 0.0) / float(n)
        return activity, measured


def _amounts(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, int | float)}


def _aware(value: datetime, now: datetime) -> datetime:
    """SQLite hands back aggregates without the column type's UTC conversion."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=now.tzinfo)
