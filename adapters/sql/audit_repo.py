"""Rows for the fleet audit: runs with their workload and newest telemetry (their pods come from
the utilization accounting's read), and the inventory's non-GPU pods per GPU node."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from sqlalchemy import delete, func, insert, or_, select
from sqlalchemy.orm import Session

from adapters.sql.tables import (
    ClusterRow,
    NodePodSummaryRow,
    NodePoolRow,
    NodeRow,
    PriorityClassRow,
    QueueRow,
    RunRow,
    TeamRow,
    TelemetryWindowRow,
    WorkloadRow,
)
from controlplane.core.audit import NodePodsFact
from controlplane.service.audit_records import AuditRun, NodePods

LIVE = ("admitted", "dispatching", "running")
MAX_SAMPLE = 8


class SqlAuditRepository:
    def __init__(self, session: Session) -> None:
        self.s = session

    def runs(self, since: datetime) -> list[AuditRun]:
        wanted = or_(RunRow.state.in_(LIVE), RunRow.created_at >= since, RunRow.finished_at >= since)
        rows = self.s.execute(
            select(
                RunRow.id,
                RunRow.state,
                RunRow.created_at,
                RunRow.started_at,
                RunRow.finished_at,
                RunRow.end_cause,
                WorkloadRow.name,
                WorkloadRow.kind,
                WorkloadRow.priority_class,
                PriorityClassRow.preemptible,
                TeamRow.name,
                QueueRow.name,
                ClusterRow.name,
            )
            .join(WorkloadRow, WorkloadRow.id == RunRow.workload_id)
            .join(TeamRow, TeamRow.id == WorkloadRow.team_id)
            .join(QueueRow, QueueRow.id == WorkloadRow.queue_id)
            .join(ClusterRow, ClusterRow.id == RunRow.cluster_id)
            .join(PriorityClassRow, PriorityClassRow.name == WorkloadRow.priority_class)
            .where(wanted)
            .order_by(RunRow.id)
        ).all()
        newest = self._newest_windows() if rows else {}
        out = []
        for (
            run_id,
            state,
            created_at,
            started_at,
            finished_at,
            end_cause,
            workload,
            kind,
            class_name,
            preemptible,
            team,
            queue,
            cluster,
        ) in rows:
            out.append(
                AuditRun(
                    run_id=run_id,
                    workload=workload,
                    team=team,
                    queue=queue,
                    cluster=cluster,
                    kind=kind,
                    priority_class=class_name,
                    preemptible=bool(preemptible),
                    state=state,
                    created_at=created_at,
                    started_at=started_at,
                    last_window_end=newest.get(run_id),
                    finished_at=finished_at,
                    end_cause=end_cause,
                )
            )
        return out

    def _newest_windows(self) -> dict[str, datetime]:
        """The end of each live run's newest window, in one grouped query."""
        live = select(RunRow.id).where(RunRow.state.in_(LIVE)).scalar_subquery()
        query = (
            select(
                TelemetryWindowRow.run_id,
                func.max(TelemetryWindowRow.window_start),
                func.max(TelemetryWindowRow.window_seconds),
            )
            .where(TelemetryWindowRow.run_id.in_(live))
            .group_by(TelemetryWindowRow.run_id)
        )
        found: dict[str, datetime] = {}
        for run_id, window_start, seconds in self.s.execute(query):
            if window_start is not None:  # max() keeps the column's type: an aware UTC datetime
                found[run_id] = window_start + timedelta(seconds=int(seconds or 0))
        return found

    def node_pods(self) -> list[NodePodsFact]:
        query = (
            select(NodePodSummaryRow, ClusterRow.name, NodePoolRow.name)
            .join(ClusterRow, ClusterRow.id == NodePodSummaryRow.cluster_id)
            .outerjoin(
                NodeRow, (NodeRow.cluster_id == NodePodSummaryRow.cluster_id) & (NodeRow.name == NodePodSummaryRow.node)
            )
            .outerjoin(NodePoolRow, NodePoolRow.id == NodeRow.pool_id)
            .where(NodePodSummaryRow.pods > 0)
            .order_by(ClusterRow.name, NodePodSummaryRow.node)
        )
        return [
            NodePodsFact(
                cluster=cluster,
                pool=pool or "",
                node=row.node,
                count=row.pods,
                sample=tuple(str(n) for n in row.sample[:MAX_SAMPLE]),
            )
            for row, cluster, pool in self.s.execute(query)
        ]

    def put_node_pods(self, cluster_id: str, by_node: Mapping[str, NodePods], now: datetime) -> None:
        self.s.execute(delete(NodePodSummaryRow).where(NodePodSummaryRow.cluster_id == cluster_id))
        rows = [
            {
                "cluster_id": cluster_id,
                "node": node,
                "pods": seen.count,
                "sample": list(seen.sample[:MAX_SAMPLE]),
                "observed_at": now,
            }
            for node, seen in sorted(by_node.items())
        ]
        if rows:
            self.s.execute(insert(NodePodSummaryRow), rows)
