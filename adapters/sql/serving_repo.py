"""Serving readings in SQL: the latest traffic/latency reading per run, and the audit's read of them."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from adapters.sql.tables import ClusterRow, QueueRow, RunRow, ServingReadingRow, TeamRow, WorkloadRow
from controlplane.service.serving import ServingReading, ServingSignal

LIVE_RUN_STATES = ("admitted", "dispatching", "running")
# Far below SQLite's limit on bound parameters per statement.
_IN_CHUNK = 900


class SqlServingRepository:
    def __init__(self, session: Session) -> None:
        self.s = session

    def put_readings(self, readings: Sequence[tuple[str, ServingReading]], now: datetime) -> int:
        # One row per run in a statement: PostgreSQL refuses an upsert that touches a row twice.
        newest: dict[str, tuple[str, ServingReading]] = {}
        for cluster, reading in readings:
            held = newest.get(reading.run_id)
            if held is None or reading.observed_at > held[1].observed_at:
                newest[reading.run_id] = (cluster, reading)
        if not newest:
            return 0
        rows = [
            {
                "run_id": r.run_id,
                "cluster": cluster,
                "observed_at": r.observed_at,
                "requests_per_second": r.requests_per_second,
                "latency_ms": r.latency_ms,
                "updated_at": now,
            }
            for cluster, r in (newest[k] for k in sorted(newest))
        ]
        table: Any = ServingReadingRow.__table__
        dialect = self.s.get_bind().dialect.name
        insert = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
        excluded = insert.excluded
        # Only a newer reading replaces the stored one: redelivered or reordered batches end alike.
        statement = insert.on_conflict_do_update(
            index_elements=["run_id"],
            set_={
                "cluster": excluded.cluster,
                "observed_at": excluded.observed_at,
                "requests_per_second": excluded.requests_per_second,
                "latency_ms": excluded.latency_ms,
                "updated_at": excluded.updated_at,
            },
            where=excluded.observed_at > table.c.observed_at,
        )
        self.s.execute(statement, rows)
        return len(rows)

    def latest(self, run_ids: Collection[str]) -> dict[str, ServingReading]:
        ids = sorted(set(run_ids))
        out: dict[str, ServingReading] = {}
        for start in range(0, len(ids), _IN_CHUNK):
            chunk = ids[start : start + _IN_CHUNK]
            for row in self.s.scalars(select(ServingReadingRow).where(ServingReadingRow.run_id.in_(chunk))):
                out[row.run_id] = _reading(row)
        return out

    def signals(self, limit: int = 10_000) -> list[ServingSignal]:
        r = ServingReadingRow
        rows = self.s.execute(
            select(
                RunRow.id,
                WorkloadRow.id,
                WorkloadRow.name,
                TeamRow.name,
                QueueRow.name,
                ClusterRow.name,
                WorkloadRow.serving,
                r.requests_per_second,
                r.latency_ms,
                r.observed_at,
            )
            .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
            .join(TeamRow, TeamRow.id == WorkloadRow.team_id)
            .join(QueueRow, QueueRow.id == WorkloadRow.queue_id)
            .join(ClusterRow, ClusterRow.id == RunRow.cluster_id)
            .outerjoin(r, r.run_id == RunRow.id)
            .where(RunRow.state.in_(LIVE_RUN_STATES), WorkloadRow.kind == "inference")
            .order_by(RunRow.id)
            .limit(limit)
        )
        out = []
        for run_id, workload_id, name, team, queue, cluster, serving, rps, latency, observed in rows:
            spec = serving if isinstance(serving, Mapping) else {}
            objective = spec.get("latency_objective_ms")
            out.append(
                ServingSignal(
                    run_id=run_id,
                    workload_id=workload_id,
                    workload=name,
                    team=team,
                    queue=queue,
                    cluster=cluster,
                    declared=bool(spec.get("traffic_metric") or spec.get("latency_metric")),
                    traffic_declared=bool(spec.get("traffic_metric")),
                    latency_objective_ms=float(objective) if isinstance(objective, int | float) else None,
                    requests_per_second=rps,
                    latency_ms=latency,
                    observed_at=observed,
                )
            )
        return out


def _reading(row: ServingReadingRow) -> ServingReading:
    return ServingReading(row.run_id, row.observed_at, row.requests_per_second, row.latency_ms)
